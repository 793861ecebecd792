"""What a trial run hands around: typed records instead of dicts read by string keys.

`RankPayload` goes to every spawned rank (pickled by torch.multiprocessing);
`RankMeasurement` comes back (as JSON: a file per rank); `ValidationResult` is what
`planner validate` prints, `to_json` its `--json` contract (issue 6).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

from ir.layer import LayerGraph
from planner.trial.grad_check import GradCheck


@dataclass(frozen=True)
class RankPayload:
    """What every rank needs to build, run and measure the plan."""

    plan_json: str  # the plan document (`ir.plan.plan_to_json`): data, never pickle
    plan_path: str  # for messages
    model: str  # the MODEL spec that rebuilds the model
    seq_len: int | None
    graph: LayerGraph | None  # the plan's layer IR (the executor reads it)
    batches: list  # [(inputs, target)] global batches, the same on every rank
    memory_steps: int  # steps measured under the tracker, after one warm-up step
    steps: int  # timed steps
    backend: str  # "gloo" or "nccl"
    check_steps: int  # steps of the dropout-free run for the losses; 0: no dropout
    threads: int  # intra-op threads per rank
    memory_detail: int = 0  # list this many of the largest storages live at the peak
    grad_check: bool = False  # record the first step's gradient norms (`grad_check`)


@dataclass(frozen=True)
class RankMeasurement:
    """One rank's figures."""

    peak_bytes: int
    losses: tuple[float, ...]  # every step's loss, warm-up steps included
    step_seconds: tuple[float, ...]  # per timed step
    check_losses: tuple[float, ...]  # the losses compared: the dropout-free run's, or `losses`
    peak_tensors: tuple[str, ...] = ()  # largest storages live at the peak
    # sharded-table plans: seconds per timed step of each phase (executors.phase_clock)
    phase_seconds: dict = field(default_factory=dict)
    # grad_check runs: the first step's {parameter name: gradient norm} (`grad_check`)
    grad_norms: dict = field(default_factory=dict)
    # per timed step, the main thread's wait for a core (`sched.thread_schedstat`); ()
    # where the kernel does not say
    step_runqueue_seconds: tuple[float, ...] = ()
    step_cpu_seconds: tuple[float, ...] = ()  # per timed step, the main thread's CPU

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> RankMeasurement:
        return cls(peak_bytes=int(doc["peak_bytes"]), losses=tuple(doc["losses"]),
                   step_seconds=tuple(doc["step_seconds"]),
                   check_losses=tuple(doc["check_losses"]),
                   peak_tensors=tuple(doc["peak_tensors"]),
                   phase_seconds=dict(doc.get("phase_seconds", {})),
                   grad_norms=dict(doc.get("grad_norms", {})),
                   step_runqueue_seconds=tuple(doc.get("step_runqueue_seconds", ())),
                   step_cpu_seconds=tuple(doc.get("step_cpu_seconds", ())))

def unqueued_step_seconds(ranks: list[RankMeasurement]) -> tuple[float, ...]:
    """Per timed step, the largest over `ranks` of a rank's wall seconds less its main
    thread's run-queue wait in that step: the step without the time a rank was ready but
    had no core (other processes' load, which no cost model prices; issue 17). Exact on
    one rank; with several, a rank's wait at a collective for a peer that was queued
    stays in (an upper bound of the step on idle cores). () where any rank lacks the
    reading."""
    if not ranks or any(len(r.step_runqueue_seconds) != len(r.step_seconds) for r in ranks):
        return ()
    return tuple(max(r.step_seconds[i] - r.step_runqueue_seconds[i] for r in ranks)
                 for i in range(len(ranks[0].step_seconds)))


def busiest_cpu_step_seconds(ranks: list[RankMeasurement]) -> tuple[float, ...]:
    """Per timed step, the largest over `ranks` of a rank's main-thread CPU seconds: a
    floor of the step on idle cores (time blocked in collectives, their transfers
    included, is not CPU). () where any rank lacks the reading."""
    if not ranks or any(len(r.step_cpu_seconds) != len(r.step_seconds) for r in ranks):
        return ()
    return tuple(max(r.step_cpu_seconds[i] for r in ranks)
                 for i in range(len(ranks[0].step_seconds)))


@dataclass(frozen=True)
class RankResult:
    rank: int
    predicted_peak_bytes: int
    measured_peak_bytes: int
    peak_tensors: tuple[str, ...] = ()  # largest storages live at the peak (memory_detail)

    @property
    def error(self) -> float:
        return (self.predicted_peak_bytes - self.measured_peak_bytes) / max(self.measured_peak_bytes, 1)


@dataclass(frozen=True)
class ValidationResult:
    plan: str
    model: str
    nproc: int
    backend: str
    ranks: tuple[RankResult, ...]
    predicted_iteration_seconds: float
    measured_iteration_seconds: float
    loss_matches_reference: bool
    losses: tuple[float, ...]
    reference_losses: tuple[float, ...]
    step_seconds: tuple[float, ...]  # per timed step, slowest rank
    loss_rtol: float  # the loss check's relative tolerance (`reference.loss_rtol`)
    checked_losses: tuple[float, ...] = ()  # the losses compared (the dropout-free run's)
    predicted_time: dict = field(default_factory=dict)
    prediction_source: str = "plan"
    # This machine's per-op overhead just before the run over the spec's (>1: slower than
    # when profiled), and the two figures (spec's, now); None where not comparable (a
    # spec without the figure, or for another kind of device).
    machine_slowdown: float | None = None
    host_op_s: tuple[float, float] | None = None
    # sharded-table plans: each rank's measured seconds per step by phase
    rank_phase_seconds: tuple[dict, ...] = ()
    predicted_embedding: dict | None = None  # the tables' per-rank prediction (cost_json)
    # fp32 and bf16 plans: the first step's gradients against the same-policy reference
    grad_check: GradCheck | None = None
    # Per timed step, the largest over ranks of a rank's wall time less its main thread's
    # wait for a core (`unqueued_step_seconds`); () where the kernel does not say
    unqueued_step_seconds: tuple[float, ...] = ()
    busiest_cpu_step_seconds: tuple[float, ...] = ()  # `busiest_cpu_step_seconds`

    @property
    def measured_unqueued_seconds(self) -> float | None:
        """The median over steps of `unqueued_step_seconds`; None where not read."""
        return statistics.median(self.unqueued_step_seconds) \
            if self.unqueued_step_seconds else None

    @property
    def time_error(self) -> float:
        return (self.predicted_iteration_seconds - self.measured_iteration_seconds) / \
            self.measured_iteration_seconds

    def to_json(self) -> dict:
        """The `planner validate --json` contract (issue 6), plus a few extra keys. fp32
        and bf16 plans add (issue 17) `grad_norms_match_reference` (every layer's
        first-step gradient norm within `grad_norm_rtol` relative of one process run
        under the plan's precision policy; fp16 plans have none), `grad_norm_worst_layer` and its
        `grad_norm_worst_relative_error`; `loss_matches_reference` stays the losses
        against the fp32 reference at `loss_rtol`."""
        return {"ranks": [{"rank": r.rank, "predicted_peak_bytes": r.predicted_peak_bytes,
                           "measured_peak_bytes": r.measured_peak_bytes, "error": r.error,
                           **({"peak_tensors": list(r.peak_tensors)} if r.peak_tensors
                              else {})} for r in self.ranks],
                "predicted_iteration_seconds": self.predicted_iteration_seconds,
                "measured_iteration_seconds": self.measured_iteration_seconds,
                "loss_matches_reference": self.loss_matches_reference,
                "loss_rtol": self.loss_rtol,
                "time_error": self.time_error, "plan": self.plan, "model": self.model,
                "nproc": self.nproc, "backend": self.backend,
                "prediction_source": self.prediction_source,
                "predicted_time": self.predicted_time, "losses": list(self.losses),
                "reference_losses": list(self.reference_losses),
                "checked_losses": list(self.checked_losses),
                "step_seconds": list(self.step_seconds),
                "machine_slowdown": self.machine_slowdown,
                **({"host_op_seconds": {"spec": self.host_op_s[0], "now": self.host_op_s[1]}}
                   if self.host_op_s else {}),
                **({"phase_seconds": list(self.rank_phase_seconds)}
                   if any(self.rank_phase_seconds) else {}),
                **({"predicted_embedding": self.predicted_embedding}
                   if self.predicted_embedding else {}),
                **({"unqueued_step_seconds": list(self.unqueued_step_seconds),
                    "measured_unqueued_seconds": self.measured_unqueued_seconds}
                   if self.unqueued_step_seconds else {}),
                **({"measured_busiest_cpu_seconds":
                    statistics.median(self.busiest_cpu_step_seconds)}
                   if self.busiest_cpu_step_seconds else {}),
                **(self.grad_check.to_json() if self.grad_check is not None else {})}
