"""What the search may choose: options, the legal strategies of a layer, outer candidates.

Listing the legal strategies is kept apart from choosing one (`planner.search`).

Outer candidates (one dynamic program each): pipeline degree p (a power of two dividing
the world size), schedule, number of micro-batches m (a divisor of the global batch).
GPipe is not searched unless pinned: with the same stage times it is never faster than
1F1B (its (m-1)(max F + max B) >= (m-1) max(F + B)) and it holds all m micro-batches.
Per layer: TP degree t (a power of two dividing the stage's devices D and the layer's
heads/hidden/vocab constraints), dp = D / t (which must divide the samples of a
micro-batch), ZeRO stage, sequence parallelism when t > 1, checkpointing (none,
selective, full: `checkpoint_modes`), CPU offload of a ZeRO-3 layer (when the cluster
spec gives its host side).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import PlannerError
from ir.layer import Layer, LayerGraph
from ir.legality import layer_module_problem, pipeline_problem
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision, Schedule

# Micro-batch counts tried per pipeline degree: enough to shrink the bubble (p-1)/m, few
# enough to keep the search fast. Each is a divisor of the global batch.
MAX_MICROBATCH_CANDIDATES = 6
# The interleaved schedule is tried with this many model chunks per pipeline rank.
INTERLEAVED_CHUNKS = 2


@dataclass(frozen=True, slots=True)
class SearchOptions:
    """Restrictions and pins. None means "search it"."""

    tp: int | None = None
    dp: int | None = None
    pp: int | None = None
    zero: int | None = None
    checkpoint: Checkpoint | None = None
    sequence_parallel: bool | None = None
    schedule: Schedule | None = None
    micro_batch: int | None = None
    precision: Precision = Precision.BF16_MIXED
    optimizer: str = "adamw"
    # How the executor steps it (`ir.plan.OPTIMIZER_IMPLEMENTATIONS`); None: the
    # cluster device's default rule (`ir.plan.optimizer_implementation`).
    optimizer_impl: str | None = None
    clip_grad_norm: bool = False  # the executor clips by global norm (`apply(max_grad_norm=)`)
    uniform: bool = False  # one strategy for every layer
    max_tp: int | None = None
    no_pp: bool = False
    no_checkpoint: bool = False
    no_offload: bool = False  # never offload; search() sets it where the cluster has no host figures
    memory_budget_bytes: int | None = None  # default: the device's memory
    memory_buckets: int = 128  # memory resolution of the dynamic program
    transient_levels: int = 3  # caps tried for the max-type transient buffers
    time_limit_s: float | None = None
    top_k: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "pp", "micro_batch", "max_tp"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise PlannerError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.no_pp and self.pp not in (None, 1):
            raise PlannerError(f"--no-pp contradicts --pp {self.pp}: drop one of them")
        if self.no_checkpoint and self.checkpoint not in (None, Checkpoint.NONE):
            raise PlannerError(f"--no-checkpoint contradicts --checkpoint {self.checkpoint}")
        if self.tp is not None and self.max_tp is not None and self.tp > self.max_tp:
            raise PlannerError(f"--tp {self.tp} exceeds --max-tp {self.max_tp}")
        if self.sequence_parallel and self.tp == 1:
            raise PlannerError("--sequence-parallel needs --tp > 1")
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise PlannerError(f"--zero must be 0, 1, 2 or 3, got {self.zero}")


@dataclass(frozen=True, slots=True)
class OuterCandidate:
    pp: int
    schedule: Schedule
    num_microbatches: int
    virtual_stages: int = 1

    def __str__(self) -> str:
        v = f"x{self.virtual_stages}" if self.virtual_stages > 1 else ""
        return f"pp{self.pp}{v}·{self.schedule}·m{self.num_microbatches}"


def powers_of_two_dividing(n: int, limit: int | None = None) -> list[int]:
    out, d = [], 1
    while d <= n and (limit is None or d <= limit):
        if n % d == 0:
            out.append(d)
        d *= 2
    return out


def divisors_of(n: int) -> list[int]:
    """The divisors of n, ascending, by trial division up to sqrt(n): a global batch of
    1e9 takes 3e4 steps, not 1e9."""
    small, large, d = [], [], 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def outer_candidates(graph: LayerGraph, world: int, global_batch: int,
                     options: SearchOptions) -> list[OuterCandidate]:
    segments = len(graph.cut_points) + 1  # most stages the cut points allow
    cannot_run = layer_module_problem(graph)
    if cannot_run:
        raise PlannerError(cannot_run)
    cannot_cut = pipeline_problem(graph)
    if options.pp is not None:
        if world % options.pp:
            raise PlannerError(f"--pp {options.pp} does not divide the {world} devices")
        if options.pp > 1 and cannot_cut:
            raise PlannerError(f"--pp {options.pp}: {cannot_cut}")
        pps = [options.pp]
    elif options.no_pp or cannot_cut:
        pps = [1]
    else:
        pps = [p for p in powers_of_two_dividing(world) if p <= segments]
    out = []
    for pp in pps:
        if pp > segments:
            raise PlannerError(f"--pp {pp}: {graph.model} has only {segments} places a "
                               "pipeline can be cut; use a smaller --pp")
        schedules = [options.schedule] if options.schedule else (
            [Schedule.ONE_F_ONE_B] if pp == 1 else [Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED])
        for schedule in schedules:
            v = INTERLEAVED_CHUNKS if schedule is Schedule.INTERLEAVED else 1
            if schedule is Schedule.INTERLEAVED and pp * v > segments:
                continue
            for m in microbatch_counts(global_batch, world // pp, pp, options):
                if schedule is Schedule.INTERLEAVED and m % pp:
                    continue  # Megatron's interleaved schedule needs m to be a multiple of p
                out.append(OuterCandidate(pp, schedule, m, v))
    if not out:
        raise PlannerError(f"no pipeline configuration splits global batch {global_batch} "
                           f"over {world} devices; use a global batch that is a multiple "
                           f"of {world}")
    return out


def microbatch_counts(global_batch: int, stage_devices: int, pp: int,
                      options: SearchOptions) -> list[int]:
    """Divisors m of the global batch, each leaving at least one sample per replica for
    some legal dp; at least p for a pipeline (fewer leaves ranks idle)."""
    if options.micro_batch is not None and options.dp is not None:
        per_step = options.micro_batch * options.dp
        if global_batch % per_step:
            raise PlannerError(f"global batch {global_batch} is not divisible by micro-batch "
                               f"{options.micro_batch} x dp {options.dp}; use a multiple of {per_step}")
        return [global_batch // per_step]
    min_dp = max(1, stage_devices // (options.max_tp or options.tp or stage_devices))
    if options.dp is not None:
        min_dp = options.dp
    divisors = [m for m in divisors_of(global_batch)
                if (global_batch // m) % min_dp == 0 and m >= min(pp, global_batch)]
    if pp > 1:
        divisors = [m for m in divisors if m >= pp]
    if options.micro_batch is not None:
        divisors = [m for m in divisors if (global_batch // m) % options.micro_batch == 0
                    and global_batch // m // options.micro_batch <= stage_devices]
    if len(divisors) <= MAX_MICROBATCH_CANDIDATES:
        return divisors
    # Keep the smallest few and a geometric spread of the rest.
    keep = set(divisors[:2])
    step = (len(divisors) - 1) / (MAX_MICROBATCH_CANDIDATES - 2)
    keep.update(divisors[round(i * step)] for i in range(MAX_MICROBATCH_CANDIDATES - 1))
    return sorted(keep)


def model_tp_degrees(graph: LayerGraph, stage_devices: int, max_tp: int | None) -> set[int]:
    """TP degrees some TP-able layer admits. A layer with nothing to split takes only
    these: its TP group exists to match its neighbours' layout, never for itself."""
    degrees = {1}
    for layer in graph.layers:
        if layer.tp_candidates:
            degrees.update(t for t in powers_of_two_dividing(stage_devices, max_tp)
                           if layer.tp_degree_allowed(t))
    return degrees


def checkpoint_modes(layer: Layer) -> list[Checkpoint]:
    """The checkpointing modes offered a layer: all three, as the executor runs each on
    any layer (`executors.checkpointing`). Where SELECTIVE's policy keeps nothing of the
    layer's (no linear matmul: an embedding, a norm) it prices as FULL does, and the
    search's dominance pruning keeps one of the two."""
    return [Checkpoint.NONE, Checkpoint.SELECTIVE, Checkpoint.FULL]


def layer_strategies(layer: Layer, stage_devices: int, samples_per_microbatch: int,
                     options: SearchOptions, seq_len: int | None,
                     model_degrees: set[int] | None = None) -> list[LayerStrategy]:
    """Every legal strategy of one layer on a stage of `stage_devices` devices. Sequence
    parallelism is offered only where it changes how the layer runs
    (`ir.legality.sequence_parallel_applies`) and the sequence splits over tp."""
    out = []
    for tp in powers_of_two_dividing(stage_devices, options.max_tp):
        if options.tp is not None and tp != options.tp:
            continue
        if layer.tp_candidates and not layer.tp_degree_allowed(tp):
            continue
        if not layer.tp_candidates and model_degrees is not None and tp not in model_degrees:
            continue
        dp = stage_devices // tp
        if options.dp is not None and dp != options.dp:
            continue
        if samples_per_microbatch % dp:
            continue
        if options.micro_batch is not None and samples_per_microbatch // dp != options.micro_batch:
            continue
        modes = [DPMode.REPLICATE] if dp == 1 else list(DPMode)
        if options.zero is not None:
            modes = [DPMode.from_stage(options.zero)] if dp > 1 or options.zero == 0 else []
        sp_runs = (tp > 1 and layer.sequence_parallel_ok and seq_len is not None
                   and seq_len % tp == 0)
        sps = [False, True] if sp_runs else [False]
        if options.sequence_parallel is not None:
            if options.sequence_parallel and tp == 1:
                continue  # --sequence-parallel asks for tensor parallelism everywhere
            sps = [options.sequence_parallel and sp_runs]
        ckpts = checkpoint_modes(layer)
        if options.no_checkpoint:
            ckpts = [Checkpoint.NONE]
        elif options.checkpoint is not None:
            ckpts = [options.checkpoint]
        for mode in modes:
            for sp in sps:
                for ckpt in ckpts:
                    out.append(LayerStrategy(tp=tp, dp=dp, dp_mode=mode,
                                             sequence_parallel=sp, checkpoint=ckpt))
                    if mode is DPMode.ZERO3 and not options.no_offload:  # cost_models.offload
                        out.append(LayerStrategy(tp=tp, dp=dp, dp_mode=mode, sequence_parallel=sp,
                                                 checkpoint=ckpt, offload=True))
    return out
