"""validate's one-process reference runs where the plan ran (a >1B model's fp32 steps take
minutes on a CPU), and on the CPU where the whole global batch does not fit the GPU
(review, 2026-11-25: a plan that fits only by checkpointing or sharding)."""

import torch

from planner.trial import reference


def test_the_reference_falls_back_to_the_cpu_when_the_gpu_runs_out(monkeypatch):
    tried = []

    def run_on(*args):
        device = args[-1]
        tried.append(device)
        if device == "cuda":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return reference.ReferenceRun([1.0], {})

    monkeypatch.setattr(reference, "_reference_on", run_on)
    assert reference.reference_run("gpt-tiny", None, "adamw", [], 1, device="cuda").losses == [1.0]
    assert tried == ["cuda", "cpu"]
    tried.clear()
    reference.reference_run("gpt-tiny", None, "adamw", [], 1)
    assert tried == ["cpu"]


def test_the_reference_moves_the_batches_to_its_device():
    inputs = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    moved = reference._moved((inputs, torch.zeros(2)), "meta")
    assert moved[0]["input_ids"].device.type == "meta" and moved[1].device.type == "meta"


def test_the_reference_steps_the_optimizer_as_the_plan_records(monkeypatch):
    from executors import optimizer

    chosen = []
    real = optimizer.step_implementation

    def recorded(cls, kwargs, implementation, device_type):
        chosen.append(implementation)
        return real(cls, kwargs, implementation, device_type)

    monkeypatch.setattr(optimizer, "step_implementation", recorded)
    batches = reference.global_batches("gpt-tiny", 2, None, 1)
    reference.reference_run("gpt-tiny", None, "adamw", batches, 1, optimizer_impl="foreach")
    assert chosen == ["foreach"]
