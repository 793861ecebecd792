"""What a trial run is measured against: the plan's prediction per rank, at the plan's
shape, and how far this machine has drifted since its spec was profiled.

The prediction is the plan file's `predicted` block (made when the plan was searched),
or a fresh `cost_models.estimate` on `cluster` when one is given (e.g. a calibrated
spec). Memory is compared without the spec's fixed `runtime_overhead_bytes`: the
tracker and the allocator see tensors, not the process.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from cost_models.clusters import host_op_rounds_s
from cost_models.common import model_layer_configs
from cost_models.estimate import estimate
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.plan import PlanDocument


@dataclass(frozen=True)
class StagePeak:
    """One pipeline stage's predicted peak, whichever source it came from."""

    peak_bytes: int
    device_peak_bytes: tuple[int, ...]  # per device of the stage (ZeRO-1 owners differ); or ()
    overhead_bytes: int  # the spec's fixed runtime overhead, inside the peaks

    @classmethod
    def from_json(cls, stage: dict) -> StagePeak:
        """A stage of a plan file's `predicted.memory.stages` (`StageMemory.to_json`)."""
        return cls(int(stage["peak_bytes"]),
                   tuple(int(b) for b in stage.get("device_peak_bytes") or ()),
                   int(stage["breakdown"].get("overhead", 0)))

    def rank_peak_bytes(self, device: int) -> int:
        """The peak of the stage's `device`-th rank (TP x DP order), without the overhead."""
        peak = self.device_peak_bytes[device] if self.device_peak_bytes else self.peak_bytes
        return peak - self.overhead_bytes


@dataclass(frozen=True)
class Prediction:
    peak_bytes_by_rank: tuple[int, ...]  # without the runtime overhead
    iteration_seconds: float
    time_breakdown: dict  # `TimeBreakdown.to_json` terms
    source: str  # "plan", or the name of the spec re-estimated on
    embedding: dict | None = None  # sharded tables: per-rank seconds (table_report.cost_json)


def predict(doc: PlanDocument, graph, cluster: ClusterSpec | None) -> Prediction:
    """The plan's `predicted` block, or a fresh estimate on `cluster` (also when the plan
    has no block)."""
    predicted = doc.predicted
    stages = predicted.get("memory", {}).get("stages") if isinstance(predicted, dict) else None
    if cluster is None and stages and "iteration_seconds" in predicted:
        stage_peaks = [StagePeak.from_json(s) for s in stages]
        seconds, breakdown, source = float(predicted["iteration_seconds"]), \
            dict(predicted.get("time", {})), "plan"
        embedding = predicted.get("embedding")
    else:
        spec = cluster or ClusterSpec.from_dict(doc.cluster, "plan cluster")
        if doc.plan.embeddings is not None:  # sharded tables: dense estimate + placement
            from planner.table_hybrid import estimate_hybrid
            fresh = estimate_hybrid(graph, doc.plan, spec)
            stage_peaks = [StagePeak.from_json(s) for s in fresh["memory"]["stages"]]
            devices = doc.plan.stages[0].devices
            peaks = tuple(stage_peaks[r // devices].rank_peak_bytes(r % devices)
                          for r in range(doc.plan.world_size))
            return Prediction(peaks, fresh["iteration_seconds"], fresh["time"], spec.name,
                              fresh["embedding"])
        est = estimate(graph, doc.plan, spec, configs=_configs(doc, graph, spec))
        embedding = None
        stage_peaks = [StagePeak(int(s.peak_bytes), tuple(int(b) for b in s.device_peak_bytes),
                                 int(s.overhead)) for s in est.memory.stages]
        seconds, breakdown, source = est.iteration_seconds, est.time.to_json(), spec.name
    devices = doc.plan.stages[0].devices  # ranks per pipeline rank (TP x DP)
    peaks = tuple(stage_peaks[r // devices].rank_peak_bytes(r % devices)
                  for r in range(doc.plan.world_size))
    return Prediction(peaks, seconds, breakdown, source, embedding)


def _configs(doc: PlanDocument, graph, spec: ClusterSpec):
    """Per-layer configs of the run `planner.trial.rank` makes: of the model built on meta
    for a plan made so (`planner.models.planned_on_meta`), else of the CPU build."""
    from planner.models import executor_model, plan_model_spec, planned_on_meta

    model = (executor_model(plan_model_spec(doc), graph) if planned_on_meta(doc)
             else None)
    return model_layer_configs(graph, doc.plan, spec.device, model)


def host_op_reading(spec: ClusterSpec) -> tuple[float, float] | None:
    """(the spec's per-op host seconds, this machine's reading of the same probe now): on
    CPU specs the CPU, on GPU specs the GPU the run uses. None where the spec has no such
    figure or the run is on another kind of device. Shared machines move it 20-50% within
    minutes, lent GPU machines' hosts 1.7x between loans: a time error of that size is the
    machine. Taken after the ranks: on a GPU it opens a CUDA context on the run's device."""
    if spec.op_overhead_s <= 0:
        return None
    cuda = torch.cuda.is_available()
    if spec.host_bound == cuda:  # a CPU spec run on GPUs, or a GPU spec with none here
        return None
    if spec.host_bound and spec.backward_op_overhead_s is not None:
        # a profiled CPU spec's figure is the per-pass probe's forward (`device_spec`,
        # `profile_cluster`); the block probe reads ~0.7x of it on the same host
        from cost_models.host_probes import host_op_seconds_by_pass

        return spec.op_overhead_s, host_op_seconds_by_pass("cpu").forward_s
    now_s = statistics.median(host_op_rounds_s("cpu" if spec.host_bound else "cuda"))
    return spec.op_overhead_s, now_s


def machine_slowdown(reading: tuple[float, float] | None) -> float | None:
    """How much slower than when the spec was profiled this host runs now (>1: slower)."""
    return None if reading is None else reading[1] / reading[0]


def plan_graph(doc: PlanDocument, path: str = "<plan>", model_spec: str | None = None):
    """The layer IR of the plan's model at the plan's shape; a plan made for another
    model (or an older version of this one) is refused, naming both fingerprints."""
    from planner.models import load_layer_graph, plan_model_spec

    dtype = getattr(torch, doc.graph_dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise PlannerError(f"plan {path} records an unknown IR dtype {doc.graph_dtype!r}; "
                           "re-create it with `planner plan`")
    model = plan_model_spec(doc, model_spec)
    graph = load_layer_graph(model, doc.graph_micro_batch, doc.seq_len, dtype)
    if graph.fingerprint != doc.fingerprint:
        difference = doc.model_difference(graph)
        raise PlannerError(
            f"plan {path} was made for another model (fingerprint {doc.fingerprint}); "
            f"{model} traces to fingerprint {graph.fingerprint} now: re-plan with "
            f"`planner plan {model} --cluster local --gpus-per-node "
            f"{doc.plan.world_size} --global-batch {doc.plan.global_batch} --out FILE`"
            + (f" (it {difference})" if difference else ""))
    return graph
