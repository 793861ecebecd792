"""The TorchRec-style greedy placement: the baseline our plan is ranked beside."""

from __future__ import annotations

from planner.table_problem import Option, PlacementProblem, Solution


def greedy(problem: PlacementProblem) -> Solution | None:
    """TorchRec's default planner, reduced to its two rules (torchrec/distributed/planner:
    GreedyProposer's first proposal and GreedyPerfPartitioner):
      1. each table takes the sharding option with the lowest perf, perf being the sum of
         its shards' estimated seconds (here: rank_time of each shard and of the every-rank
         part, summed), over the default GPU sharding types (data-parallel, table-wise,
         row-wise, table-row-wise, column-wise);
      2. options are placed in descending perf, each shard on the device with the lowest
         accumulated perf that still has the storage for it (ties: the lowest rank);
      3. when a table finds no device with room, the proposer moves that table to its
         next-best option and partitions again.
    Device perf is additive here as in TorchRec; the result is then priced with the
    full (non-additive) cost model like every other plan."""
    n = problem.n
    ranked = [sorted((o for o in opts if all(problem.fits(p + o.common) for p in o.pieces or (o.common,))),
                     key=lambda o: (problem.perf(o), o.sharding.value)) for opts in problem.options]
    if not all(ranked):
        return None
    index = [0] * len(ranked)
    while True:  # a proposal that cannot be partitioned moves its failing table to its next option
        picks = [options[i] for options, i in zip(ranked, index)]
        ranks, failed = _greedy_partition(problem, picks)
        if failed is None:
            return problem.solution(picks, ranks)
        index[failed] += 1
        if index[failed] == len(ranked[failed]):
            return None


def _greedy_partition(problem: PlacementProblem, picks: list[Option]):
    """GreedyPerfPartitioner: ([ranks per table], None), or (None, the table that did not fit)."""
    n = problem.n
    device_perf = [0.0] * n
    memory = [0.0] * n
    ranks: list[tuple[int, ...]] = [()] * len(picks)
    for opt in picks:  # the every-rank part first: it is on every device whatever happens
        for r in range(n):
            device_perf[r] += problem.f(opt.common)
            memory[r] += opt.common.memory_bytes
    if max(memory) > problem.capacity:
        return None, max(range(len(picks)), key=lambda t: picks[t].common.memory_bytes)
    order = sorted(range(len(picks)), key=lambda t: -sum(problem.f(p) for p in picks[t].pieces))
    for t in order:
        opt = picks[t]
        if opt.fixed_ranks is not None:
            for r, piece in zip(opt.fixed_ranks, opt.pieces):
                device_perf[r] += problem.f(piece)
                memory[r] += piece.memory_bytes
            if any(memory[r] > problem.capacity for r in opt.fixed_ranks):
                return None, t
            ranks[t] = opt.fixed_ranks
            continue
        chosen = []
        for piece in opt.pieces:
            candidates = [r for r in range(n) if r not in chosen
                          and memory[r] + piece.memory_bytes <= problem.capacity]
            if not candidates:
                return None, t
            r = min(candidates, key=lambda r: (device_perf[r], r))
            chosen.append(r)
            device_perf[r] += problem.f(piece)
            memory[r] += piece.memory_bytes
        ranks[t] = tuple(chosen)
    return ranks, None
