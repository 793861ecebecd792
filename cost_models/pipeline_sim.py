"""An event simulator of one pipeline step: replay each rank's pass order with per-stage
times and p2p transfers, and read off the makespan and every rank's busy and idle time.

The closed forms of `cost_models.pipeline` are checked against it (tests/
test_pipeline_schedule.py, bench/bench_pipeline_schedule.py). Model:

  stages     S = pp * v; local chunk c of rank r is stage c * pp + r (torch's "loop"
             placement, `generate_stage_to_rank_mapping`)
  order      each rank runs its passes in the order `pipeline_ops.rank_ops` gives (equal,
             pass for pass, to torch's `pipeline_order`: tests/test_pipeline_schedule.py)
  F(s, i)    starts after F(s-1, i) has finished and its output has crossed boundary s-1
  B(s, i)    starts after B(s+1, i) has finished and the gradient has crossed back, and
             after F(s, i) (the last stage's backward follows its own forward and loss)
  p2p        a transfer of `send_*_s` seconds starts when the pass that produced it ends
             and completes after that time whenever the receiver posts its receive.
             With `sends_block` (torch's Schedule1F1B, read off its `_step_microbatches`
             in tests/test_pipeline_schedule.py) the sender waits for it before its next
             pass when that pass is of the other kind (steady state: the send is fused
             with the next receive), else before the pass after (warm-up forwards,
             cool-down backwards: the wait follows the next compute). Links are not
             shared between boundaries.
  rank       one pass at a time, in order; a pass starts when the rank is free and its
             inputs are there.

Pure Python and linear in the number of passes (2 m S): a 64-rank, 256-micro-batch,
4-chunk step (131,072 passes) replays in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ir.errors import PlannerError
from ir.strategy import Schedule

from cost_models.pipeline_ops import PassOp, rank_ops

# Whether torch's schedule waits for a pass's sends before the rank computes on:
#   1F1B: Schedule1F1B._step_microbatches fuses each steady-state send with the next
#         receive in one batch and waits on the batch before computing
#         (`_wait_batch_p2p`); warm-up and cool-down sends are waited after the next pass.
#   GPipe: ScheduleGPipe keeps its sends in `fwd_sends_to_wait` / `bwd_sends_to_wait`
#         and waits on them after the loop: the sender runs on.
#   interleaved: _PipelineScheduleRuntime appends sends to `send_ops`, waited before
#         step() returns: the sender runs on.
SENDS_BLOCK = {Schedule.GPIPE: False, Schedule.ONE_F_ONE_B: True, Schedule.INTERLEAVED: False}


@dataclass(frozen=True, slots=True)
class StageCost:
    """Seconds of one (virtual) stage for one micro-batch."""

    forward_s: float  # compute (and anything blocking) of the forward pass
    backward_s: float  # of the backward pass, recompute included
    send_forward_s: float = 0.0  # p2p of its output to the next stage (0 on the last)
    send_backward_s: float = 0.0  # p2p of its input's gradient back (0 on the first)

    def __str__(self) -> str:
        return (f"F{self.forward_s:.4g}+{self.send_forward_s:.2g} "
                f"B{self.backward_s:.4g}+{self.send_backward_s:.2g}")


@dataclass(frozen=True, slots=True)
class SimResult:
    makespan_s: float  # first forward starts at 0; the last pass ends here
    busy_s: tuple[float, ...]  # per rank: seconds computing
    send_s: tuple[float, ...]  # per rank: seconds held waiting on its own sends
    finish_s: tuple[float, ...]  # per rank: when its last pass ended

    @property
    def idle_s(self) -> tuple[float, ...]:
        """Per rank: the step's seconds it neither computed nor sent."""
        return tuple(self.makespan_s - b - s for b, s in zip(self.busy_s, self.send_s))

    @property
    def bubble_fraction(self) -> float:
        """Idle time of the busiest rank relative to its work, as `PipelineTime`'s."""
        work = [b + s for b, s in zip(self.busy_s, self.send_s)]
        top = max(work)
        return (self.makespan_s - top) / top if top else 0.0


def simulate(stages: Sequence[StageCost], orders: Mapping[int, Sequence[PassOp]], pp: int,
             sends_block: bool) -> SimResult:
    """Replay `orders` (rank -> its passes) over `stages` (pp * v of them, module
    docstring). Raises PlannerError when the orders deadlock or miss a pass."""
    n_stages = len(stages)
    if pp < 1 or n_stages % pp or sorted(orders) != list(range(pp)):
        raise PlannerError(f"simulate needs pp * v stages and one order per rank 0..pp-1, "
                           f"got {n_stages} stages, pp={pp}, ranks {sorted(orders)}")
    last = n_stages - 1
    # p2p seconds into stage s's forward input and into its backward input; zero where
    # both stages sit on one rank (pp == 1).
    into_fwd = [0.0] + [stages[s - 1].send_forward_s if (s - 1) % pp != s % pp else 0.0
                        for s in range(1, n_stages)]
    into_bwd = [stages[s + 1].send_backward_s if (s + 1) % pp != s % pp else 0.0
                for s in range(last)] + [0.0]
    done: dict[tuple[bool, int, int], float] = {}  # (forward, stage, mb) -> end seconds
    waiting: dict[tuple[bool, int, int], int] = {}  # a pass not yet run -> the rank on it
    ptr = [0] * pp
    free = [0.0] * pp
    busy = [0.0] * pp
    sent = [0.0] * pp
    hold: list[dict[int, float]] = [{} for _ in range(pp)]  # pass index -> sends' end
    end_all = 0.0
    ready = list(range(pp))
    while ready:
        r = ready.pop()
        ops = orders[r]
        while ptr[r] < len(ops):
            op = ops[ptr[r]]
            s = op.chunk * pp + r
            if s >= n_stages:
                raise PlannerError(f"rank {r}'s pass {op} names stage {s} of {n_stages}")
            mb = op.microbatch
            if op.forward:
                dep, lag = ((True, s - 1, mb), into_fwd[s]) if s else (None, 0.0)
            elif s < last:
                dep, lag = (False, s + 1, mb), into_bwd[s]
            else:
                dep, lag = (True, s, mb), 0.0
            if dep is not None and dep not in done:
                waiting[dep] = r
                break
            if not op.forward and s < last and (True, s, mb) not in done:
                raise PlannerError(f"rank {r} runs {op} before its forward")
            ready_s = max(free[r], done[dep] + lag if dep is not None else 0.0)
            start = max(ready_s, hold[r].pop(ptr[r], 0.0))
            sent[r] += start - ready_s
            cost = stages[s]
            seconds = cost.forward_s if op.forward else cost.backward_s
            end = start + seconds
            out = (cost.send_forward_s if s < last else 0.0) if op.forward else \
                (cost.send_backward_s if s > 0 else 0.0)
            key = (op.forward, s, mb)
            done[key] = end
            busy[r] += seconds
            free[r] = end
            if sends_block and out:
                nxt = send_waited_before(ops, ptr[r])
                hold[r][nxt] = max(hold[r].get(nxt, 0.0), end + out)
            end_all = max(end_all, end)
            ptr[r] += 1
            woken = waiting.pop(key, None)
            if woken is not None:
                ready.append(woken)
    stuck = [r for r in range(pp) if ptr[r] < len(orders[r])]
    if stuck:
        r = stuck[0]
        raise PlannerError(f"the pass orders deadlock: rank {r} waits at "
                           f"{orders[r][ptr[r]]}; check the schedule's orders")
    m = len(done) // (2 * n_stages)
    if len(done) != 2 * n_stages * m or any((f, s, i) not in done for f in (True, False)
                                           for s in range(n_stages) for i in range(m)):
        raise PlannerError(f"the pass orders ran {len(done)} passes, not one forward and "
                           "one backward per stage and micro-batch")
    # The last pass is stage 0's last backward, which sends nothing: the step ends there.
    return SimResult(end_all, tuple(busy), tuple(sent), tuple(free))


def send_waited_before(ops: Sequence[PassOp], i: int) -> int:
    """Index of the pass before which Schedule1F1B waits on the send of pass i (len(ops):
    at the end): the next pass when it is of the other kind (the send is fused with that
    pass's receive), else the one after (the wait follows the next compute)."""
    nxt = i + 1
    if nxt < len(ops) and ops[nxt].forward == ops[i].forward:
        nxt += 1
    return min(nxt, len(ops))


def simulate_schedule(schedule: Schedule, stages: Sequence[StageCost], pp: int,
                      num_microbatches: int, virtual_stages: int = 1) -> SimResult:
    """`simulate` with torch's pass order for `schedule` (`pipeline_ops.rank_ops`) and
    its send behaviour (SENDS_BLOCK)."""
    if len(stages) != pp * virtual_stages:
        raise PlannerError(f"{schedule} with pp={pp} and {virtual_stages} virtual stages "
                           f"needs {pp * virtual_stages} stage costs, got {len(stages)}")
    orders = {r: rank_ops(schedule, pp, r, num_microbatches, virtual_stages)
              for r in range(pp)}
    return simulate(stages, orders, pp, SENDS_BLOCK[schedule])
