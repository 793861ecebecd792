"""Host seconds the executor's own training loop costs a step, cold (`train_loop_host_s`,
priced by `cost_models.step_host.step_loop_s`); one thread, the probe clock.

`executors.runtime.ParallelModel.train_step` does, beyond the model's forward, the loss
function, backward and the optimizer step: the batch's moves and shards (`local_batch`),
the target's count, the micro-batch split, the weighted loss and its sum, the loss's
all-reduce started and waited on, `reduce_partial_grads`, the tied gradients' sync and
`float(value)`. A step runs them between its layers' work, their code and data out of the
caches; the kit's per-op figures time ops back to back, warm. Measured here (steploop,
2026-11-25, load 8-12, one process, one thread): a real mlp-1rank step spent ~0.38 ms
there where 20 warm ops and the loss all-reduce priced 0.136 ms.

The probe applies a one-rank fp32 plan to one Linear (`executors.apply`, a world-1 gloo
group made where none exists) and times, after a step layer's forward and backward
(`cold_entry_probes.neighbour_block`, untimed, as a step's layers run before its loop's
work), `train_step` and the same forward, loss, backward and optimizer step + zero_grad
called bare; rounds alternate the two, and the medians' difference is the loop's.

    seconds = train_loop_host_s("cpu")   # doctest: +SKIP

It lives beside the planner, not in cost_models, because it runs the executor; the CPU
kits (`planner profile-device --device cpu`, `planner profile-cluster`) add its figure to
the spec they measured (`with_train_loop`).
"""

from __future__ import annotations

import dataclasses
import statistics

TRAIN_LOOP_WIDTH = 16  # one 16x16 Linear: its kernels ~0 of the step
TRAIN_LOOP_BATCH = 2
TRAIN_LOOP_ROUNDS = 60  # after TRAIN_LOOP_WARMUP untimed, each timing both ways
TRAIN_LOOP_WARMUP = 5
# Bias-free Linears of the parameter-walk probe's larger module, one tensor each: the
# walk visits modules too, and the zoo's models hold about one module per tensor
# (gpt-tiny 68 and 68, cnn-small 17 and 17); 64, near gpt-tiny's count
PARAM_WALK_LINEARS = 64


def train_loop_host_s(device: str = "cpu") -> float:
    """Host seconds `train_step` costs more than its model's forward, loss, backward and
    optimizer step called bare, each after a step layer's work (module docstring), >= 0;
    a PlannerError inside a multi-rank group."""
    import torch
    from torch import nn

    from cost_models.clusters import _one_thread
    from cost_models.cold_entry_probes import ENTRY_TOKENS, ENTRY_WIDTH, neighbour_block
    from cost_models.host_probes import probe_clock
    from cost_models.step_host import TRAIN_LOOP_PROBE_PARAM_TENSORS
    from cost_models.step_loop_probes import one_process_group  # it imports this module
    from executors.apply import apply
    from ir.measure import build_layer_graph
    from ir.plan import uniform_plan
    from ir.strategy import Precision

    with one_process_group("the training-loop probe"), _one_thread():
        loss_fn = nn.functional.mse_loss
        x = torch.randn(TRAIN_LOOP_BATCH, TRAIN_LOOP_WIDTH)
        y = torch.randn(TRAIN_LOOP_BATCH, TRAIN_LOOP_WIDTH)
        model = nn.Sequential(nn.Linear(TRAIN_LOOP_WIDTH, TRAIN_LOOP_WIDTH))
        # the estimate takes this model's tensors off the parameter walk it prices
        assert len(list(model.parameters())) == TRAIN_LOOP_PROBE_PARAM_TENSORS
        graph = build_layer_graph(model, {"input": x}, y, loss_fn, dtype=torch.float32)
        plan = uniform_plan(len(graph.layers), precision=Precision.FP32,
                            micro_batch=TRAIN_LOOP_BATCH, global_batch=TRAIN_LOOP_BATCH)
        pm = apply(model, plan, graph, loss_fn=loss_fn, device=device)
        inputs, target = {"input": x.to(device)}, y.to(device)
        block = neighbour_block().to(device)
        before = torch.randn(1, ENTRY_TOKENS, ENTRY_WIDTH, device=device)
        clock = probe_clock(device)

        def bare() -> None:
            loss_fn(pm.module(**inputs), target).backward()
            pm.optimizer.step()
            pm.optimizer.zero_grad(set_to_none=True)

        def loop() -> None:
            pm.train_step(inputs, target)

        times: dict[bool, list[float]] = {False: [], True: []}
        for rnd in range(TRAIN_LOOP_WARMUP + TRAIN_LOOP_ROUNDS):
            for in_loop in ((True, False) if rnd % 2 else (False, True)):
                block(before).sum().backward()  # a step's layers ran before
                block.zero_grad(set_to_none=True)
                start = clock()
                (loop if in_loop else bare)()
                if rnd >= TRAIN_LOOP_WARMUP:
                    times[in_loop].append(clock() - start)
        return max(0.0, statistics.median(times[True]) - statistics.median(times[False]))


def train_loop_param_host_s(device: str = "cpu") -> float:
    """Host seconds per parameter tensor the loop's walk over the rank's parameters costs
    (`executors.tensor_parallel.reduce_partial_grads(module.parameters())`, as
    `train_step` calls it), each after a step layer's forward and backward as in a step:
    (a module of PARAM_WALK_LINEARS bias-free Linears - one) / (PARAM_WALK_LINEARS - 1),
    rounds alternating the two, >= 0. Read 2026-11-26 (load 6-8): ~1.0 us; inside a
    gpt-tiny step 2.5 us per tensor (bench/bench_step_terms.py: its whole backward's
    working set before it, colder than the kit's one block leaves it; after a block on
    512 tokens the probe reads 3.0 us): this figure is a floor."""
    import torch
    from torch import nn

    from cost_models.clusters import _one_thread
    from cost_models.cold_entry_probes import ENTRY_TOKENS, ENTRY_WIDTH, neighbour_block
    from cost_models.host_probes import probe_clock
    from executors.tensor_parallel import reduce_partial_grads

    with _one_thread():
        modules = {n: nn.Sequential(*[nn.Linear(TRAIN_LOOP_WIDTH, TRAIN_LOOP_WIDTH, bias=False)
                                      for _ in range(n)]).to(device)
                   for n in (1, PARAM_WALK_LINEARS)}
        for module in modules.values():  # a step's gradients, there to be visited
            for p in module.parameters():
                p.grad = torch.zeros_like(p)
        block = neighbour_block().to(device)
        before = torch.randn(1, ENTRY_TOKENS, ENTRY_WIDTH, device=device)
        clock = probe_clock(device)
        times: dict[int, list[float]] = {n: [] for n in modules}
        for rnd in range(TRAIN_LOOP_WARMUP + TRAIN_LOOP_ROUNDS):
            for n in (sorted(modules) if rnd % 2 else sorted(modules, reverse=True)):
                block(before).sum().backward()  # a step's layers ran before
                block.zero_grad(set_to_none=True)
                start = clock()
                reduce_partial_grads(modules[n].parameters())
                if rnd >= TRAIN_LOOP_WARMUP:
                    times[n].append(clock() - start)
        # per tensor = (t(N Linears) - t(1 Linear)) / (N - 1): one tensor per Linear
        extra_s = statistics.median(times[PARAM_WALK_LINEARS]) - statistics.median(times[1])
        return max(0.0, extra_s / (PARAM_WALK_LINEARS - 1))


def with_train_loop(spec, device: str = "cpu"):
    """`spec` with its kernel calibration's `train_loop_host_s` and
    `train_loop_param_host_s` measured here (CPU kits)."""
    cal = dataclasses.replace(spec.kernel_calibration, train_loop_host_s=train_loop_host_s(device),
                              train_loop_param_host_s=train_loop_param_host_s(device))
    return dataclasses.replace(spec, kernel_calibration=cal)
