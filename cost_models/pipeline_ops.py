"""The order in which one pipeline rank runs its forward and backward passes.

Each schedule is reproduced from torch.distributed.pipelining (schedules.py), which the
executor runs (`executors.pipeline.build_schedule`); the memory model walks these orders
to see which micro-batches' activations a rank holds at every moment:

  GPipe        all m forwards, then all m backwards (ScheduleGPipe)
  1F1B         min(m, p - r) warm-up forwards, then backward and forward alternate,
               then the remaining backwards (Schedule1F1B._step_microbatches)
  interleaved  v local stages per rank, `_get_warmup_ops` warm-up forwards, then one
               forward and one backward per step, then the remaining backwards; the local
               stage of step k advances every m / rounds micro-batches
               (ScheduleInterleaved1F1B, `_get_1f1b_rank_ops`)

Without a pipeline (p = 1) the executor's plain loop runs each micro-batch's forward
and backward back to back (`executors.runtime`).
"""

from __future__ import annotations

from typing import NamedTuple

from ir.strategy import Schedule


class PassOp(NamedTuple):
    """One forward or backward pass of one local stage (chunk) on one micro-batch.

    A named tuple, not a frozen dataclass: a search builds some 10^5 of them, and a
    frozen dataclass's __init__ costs several times a tuple's."""

    forward: bool
    chunk: int  # local stage index on this rank (0 .. v-1)
    microbatch: int

    def __str__(self) -> str:
        return f"{'F' if self.forward else 'B'}{self.chunk}.{self.microbatch}"


def rank_ops(schedule: Schedule, pp: int, rank: int, num_microbatches: int,
             virtual_stages: int = 1) -> list[PassOp]:
    """The passes pipeline rank `rank` runs in one step, in order."""
    m = num_microbatches
    if pp == 1 and virtual_stages == 1:
        return [PassOp(fwd, 0, i) for i in range(m) for fwd in (True, False)]
    if schedule is Schedule.GPIPE:
        return [PassOp(True, 0, i) for i in range(m)] + [PassOp(False, 0, i) for i in range(m)]
    if schedule is Schedule.INTERLEAVED and virtual_stages > 1:
        return _interleaved(pp, rank, m, virtual_stages)
    warmup = min(m, pp - rank)  # torch's Schedule1F1B: the first stage runs p forwards
    ops = [PassOp(True, 0, i) for i in range(warmup)]
    for i in range(m):
        ops.append(PassOp(False, 0, i))
        if warmup + i < m:
            ops.append(PassOp(True, 0, warmup + i))
    return ops


def _interleaved(pp: int, rank: int, m: int, v: int) -> list[PassOp]:
    rounds = max(1, m // pp)
    per_round = m // rounds
    # _get_warmup_ops: (v - 1) rounds for the last rank, 2 more per rank before it
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
    total = m * v
    fwd_next = [0] * v
    bwd_next = [0] * v
    ops: list[PassOp] = []
    make = tuple.__new__  # PassOp(...) without the named tuple's Python-level __new__

    def forward(step: int) -> None:
        chunk = (step // per_round) % v
        ops.append(make(PassOp, (True, chunk, fwd_next[chunk])))
        fwd_next[chunk] += 1

    def backward(step: int) -> None:
        chunk = v - 1 - ((step - warmup) // per_round) % v
        ops.append(make(PassOp, (False, chunk, bwd_next[chunk])))
        bwd_next[chunk] += 1

    for step in range(warmup):
        forward(step)
    for step in range(warmup, total):  # steady state: one forward, one backward
        forward(step)
        backward(step)
    for step in range(total, total + warmup):  # cool-down: the remaining backwards
        backward(step)
    return ops
