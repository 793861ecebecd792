"""The pass order torch.distributed.pipelining itself runs for a schedule, without a
process group:

  multi-stage schedules (ScheduleInterleaved1F1B, ScheduleLoopedBFS, ...) build
      `pipeline_order` (rank -> list of `_Action`) in their constructor, and their runtime
      walks exactly that list; the constructor only reads `num_stages`, `group_size`,
      `group_rank`, `stage_index` (and `submod`) from its stages, so a plain record stands
      in for each `PipelineStage`;
  single-stage schedules (ScheduleGPipe, Schedule1F1B) order their passes in the code of
      `_step_microbatches`: we run that method on a recording stage whose p2p op lists are
      empty and whose forward/backward only log the micro-batch. (Their `pipeline_order`
      is a drawing for visualisation; in torch 2.13 Schedule1F1B's has the last rank skip
      micro-batch 0 and run a micro-batch m, while `_step_microbatches` runs 0..m-1.)

`pipeline_ops.rank_ops` (what the memory model and `pipeline_sim` replay) is checked
against this, pass for pass (tests/test_pipeline_schedule.py); the bench replays both.
torch is imported on first use only: the cost model itself never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ir.errors import PlannerError
from ir.strategy import Schedule

from cost_models.pipeline_ops import PassOp

# The torch class that runs each schedule (the same as `executors.pipeline.build_schedule`).
TORCH_SCHEDULE_CLASS = {Schedule.GPIPE: "ScheduleGPipe", Schedule.ONE_F_ONE_B: "Schedule1F1B",
                        Schedule.INTERLEAVED: "ScheduleInterleaved1F1B"}


@dataclass
class _StageRecord:
    """What a schedule reads from a `PipelineStage` to build or walk its pass order; the
    passes it runs are logged in `passes`."""

    num_stages: int
    group_size: int
    group_rank: int
    stage_index: int
    submod: object = None  # read by the zero-bubble schedules' compile check only
    passes: list = field(default_factory=list)

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def forward_one_chunk(self, microbatch: int, *args, **kwargs) -> None:
        self.passes.append(PassOp(True, self.stage_index // self.group_size, microbatch))

    def backward_one_chunk(self, microbatch: int, **kwargs) -> None:
        self.passes.append(PassOp(False, self.stage_index // self.group_size, microbatch))

    def get_fwd_recv_ops(self, microbatch: int) -> list:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def perform_reduce_grad(self, *args) -> None:
        pass

    def clear_runtime_states(self) -> None:
        pass


def torch_pipeline_order(schedule: Schedule | str, pp: int, num_microbatches: int,
                         virtual_stages: int = 1) -> dict[int, list[PassOp]]:
    """rank -> the forward and backward passes torch's schedule runs, in order (idle
    slots and gradient-reduction markers dropped; chunk = stage index // pp)."""
    from torch import nn
    from torch.distributed.pipelining import schedules

    name = TORCH_SCHEDULE_CLASS.get(schedule, schedule)
    cls = getattr(schedules, str(name), None)
    if cls is None:
        raise PlannerError(f"torch.distributed.pipelining has no schedule {name!r}; use one "
                           f"of {', '.join(TORCH_SCHEDULE_CLASS.values())}")
    v = virtual_stages
    multi = issubclass(cls, schedules.PipelineScheduleMulti)
    if not multi and v != 1:
        raise PlannerError(f"{name} runs one stage per rank, got {v} virtual stages")
    if not multi:
        return {r: _run_single(cls, pp, r, num_microbatches) for r in range(pp)}
    stages = [_StageRecord(pp * v, pp, 0, c * pp, nn.Module()) for c in range(v)]
    built = cls(stages, num_microbatches)
    compute = {schedules.FORWARD: True, schedules.FULL_BACKWARD: False}
    orders: dict[int, list[PassOp]] = {}
    for rank, actions in built.pipeline_order.items():
        ops = []
        for a in actions:
            if a is None or a.computation_type not in compute:
                if a is not None and a.computation_type in (schedules.BACKWARD_INPUT,
                                                            schedules.BACKWARD_WEIGHT):
                    raise PlannerError(f"{name} splits the backward (I/W passes); the "
                                       "simulator replays full backwards only")
                continue
            ops.append(PassOp(compute[a.computation_type], a.stage_index // pp,
                              a.microbatch_index))
        orders[rank] = ops
    return orders


def _run_single(cls, pp: int, rank: int, num_microbatches: int) -> list[PassOp]:
    """The passes `cls._step_microbatches` runs on pipeline rank `rank`."""
    stage = _StageRecord(pp, pp, rank, rank)
    schedule = cls(stage, num_microbatches)
    # No loss function, so no backward set-up: mark the forward set up and skip the
    # shape inference (which would need real modules and a process group).
    schedule._stage_forward_initialized = True
    schedule._stage_backward_initialized = False
    schedule._step_microbatches()
    return stage.passes
