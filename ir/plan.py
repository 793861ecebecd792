"""A parallel plan: stages, per-layer strategies, batching and schedule, as plain data.

`ParallelPlan` is what the search produces, the cost models price and the executors
apply. This module is also the one place that writes and reads the plan JSON
(schema "planner.plan/v1").
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import PlannerError
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision, Schedule, Stage

PLAN_SCHEMA = "planner.plan/v1"


# Optimizer names the memory model knows.
KNOWN_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum")


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """Everything needed to price or run one training iteration.

    Invariants (checked in __post_init__): stages are contiguous and cover every layer
    once; every layer in a stage uses all of that stage's devices (tp * dp == devices);
    global_batch == micro_batch * num_microbatches * dp of every layer.
    """

    stages: tuple[Stage, ...]
    layer_strategies: tuple[LayerStrategy, ...]  # one per layer, in layer order
    global_batch: int  # samples per optimizer step, over the whole cluster
    micro_batch: int  # samples per micro-batch per data-parallel replica
    num_microbatches: int  # gradient accumulation steps / pipeline micro-batches
    schedule: Schedule = Schedule.ONE_F_ONE_B
    precision: Precision = Precision.BF16_MIXED
    optimizer: str = "adamw"
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)

    def __post_init__(self) -> None:
        if not self.stages:
            raise PlannerError("a plan needs at least one stage")
        if self.optimizer not in KNOWN_OPTIMIZERS:
            raise PlannerError(f"unknown optimizer {self.optimizer!r}; "
                               f"use one of {', '.join(KNOWN_OPTIMIZERS)}")
        expected = 0
        for i, stage in enumerate(self.stages):
            if stage.first_layer != expected:
                raise PlannerError(f"stage {i} starts at layer {stage.first_layer}, "
                                   f"expected {expected}: stages must be contiguous")
            expected = stage.last_layer + 1
        if expected != len(self.layer_strategies):
            raise PlannerError(f"stages cover {expected} layers but the plan has "
                               f"{len(self.layer_strategies)} layer strategies")
        for i, stage in enumerate(self.stages):
            for j in range(stage.first_layer, stage.last_layer + 1):
                s = self.layer_strategies[j]
                if s.devices != stage.devices:
                    raise PlannerError(f"layer {j}: tp={s.tp} x dp={s.dp} = {s.devices} but "
                                       f"stage {i} has {stage.devices} devices")
                if self.micro_batch * self.num_microbatches * s.dp != self.global_batch:
                    raise PlannerError(
                        f"layer {j}: micro_batch {self.micro_batch} x num_microbatches "
                        f"{self.num_microbatches} x dp {s.dp} != global batch {self.global_batch}")
        if self.virtual_stages < 1:
            raise PlannerError("virtual_stages must be >= 1")
        if self.schedule is not Schedule.INTERLEAVED and self.virtual_stages != 1:
            raise PlannerError(f"virtual_stages={self.virtual_stages} needs the interleaved schedule")

    @property
    def pp(self) -> int:
        """Pipeline ranks (a rank holds `virtual_stages` stages under interleaving)."""
        return len(self.stages) // self.virtual_stages

    @property
    def world_size(self) -> int:
        return sum(s.devices for s in self.stages[: self.pp])

    def stage_of(self, layer_index: int) -> int:
        for i, stage in enumerate(self.stages):
            if stage.first_layer <= layer_index <= stage.last_layer:
                return i
        raise IndexError(f"layer {layer_index} is in no stage")

    def __str__(self) -> str:
        kinds = sorted({str(s) for s in self.layer_strategies})
        return (f"plan(pp={self.pp}, stages={len(self.stages)}, mb={self.micro_batch}x"
                f"{self.num_microbatches}, {self.schedule}, {'/'.join(kinds)})")


def uniform_plan(num_layers: int, *, tp: int = 1, dp: int = 1, pp: int = 1, zero: int = 0,
                 checkpoint: Checkpoint = Checkpoint.NONE, sequence_parallel: bool = False,
                 micro_batch: int = 1, global_batch: int | None = None,
                 schedule: Schedule = Schedule.ONE_F_ONE_B,
                 precision: Precision = Precision.BF16_MIXED, optimizer: str = "adamw",
                 virtual_stages: int = 1, stage_boundaries: tuple[int, ...] | None = None,
                 ) -> ParallelPlan:
    """One strategy for every layer; layers split into pp * virtual_stages even stages
    unless `stage_boundaries` (first layer of each stage after the first) is given."""
    num_stages = pp * virtual_stages
    if num_stages > num_layers:
        raise PlannerError(f"{num_stages} pipeline stages need at least that many layers; "
                           f"the model has {num_layers}")
    if stage_boundaries is None:
        stage_boundaries = tuple(round(num_layers * k / num_stages) for k in range(1, num_stages))
    starts = (0, *stage_boundaries)
    ends = (*(b - 1 for b in stage_boundaries), num_layers - 1)
    stages = tuple(Stage(a, b, tp * dp) for a, b in zip(starts, ends))
    strategy = LayerStrategy(tp=tp, dp=dp, dp_mode=DPMode.from_stage(zero),
                             sequence_parallel=sequence_parallel, checkpoint=checkpoint)
    if global_batch is None:
        global_batch = micro_batch * dp * max(pp, 1)
    per_replica = global_batch // dp if dp else 0
    if global_batch % dp or per_replica % micro_batch:
        raise PlannerError(f"global batch {global_batch} is not divisible by dp {dp} x "
                           f"micro-batch {micro_batch}; pick a global batch that is a "
                           f"multiple of {dp * micro_batch}")
    return ParallelPlan(stages=stages, layer_strategies=(strategy,) * num_layers,
                        global_batch=global_batch, micro_batch=micro_batch,
                        num_microbatches=per_replica // micro_batch, schedule=schedule,
                        precision=precision, optimizer=optimizer, virtual_stages=virtual_stages)
