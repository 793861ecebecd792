"""Host seconds activation checkpointing adds, probed; and their price for one layer.

The executor (`executors.checkpointing`) runs a checkpointed layer under non-reentrant
`torch.utils.checkpoint.checkpoint`; on a CPU process its Python machinery costs the host
as much as the layer's own ops; on a GPU it is host time the kernels may not cover
(llama3.2-1b on an H100, 2026-11-25: 3870 ops a step through SAC's modes, 86.8 ms of
host, the step host-bound). What it adds (torch 2.13, `torch/utils/checkpoint.py`):

  per call      forward: the frame, the inputs saved, the RNG state stashed, the hooks
                installed; backward: the first unpack starts the recompute (`fork_rng`,
                the recomputation hook, the tensors-match check). SELECTIVE also makes
                and enters its two dispatch modes (`create_selective_checkpoint_contexts`).
  per saved     forward: the pack hook (a `_Holder`, a weakref, the shape/dtype/device
  tensor        record under no_grad: ~17 Python calls, counted with cProfile on the
                gpt-tiny block, 2026-11-24; a tensor made in C++, as most of a layer's
                saves are, also gets a Python object); backward: the recomputation's
                pack hook and the unpack hook.
  per op        under the hooks, forward and recompute, whether or not it saves (probed
                ~1 and ~2-3 us on this host, 2026-11-24). SELECTIVE: every forward op
                passes through `_CachingTorchDispatchMode` (the policy
                `ir.checkpoint_policy.selective_policy` called, the output stored; a kept
                op's output also detached and wrapped); in the recompute the layer's
                Python forward runs again in full and every op passes through
                `_CachedTorchDispatchMode`; a kept op returns its stored output instead
                of running its kernel. So does the `detach` the recompute's pack hook
                makes of each saved tensor that requires grad (`_recomputation_hook`):
                on gpt-tiny's block 70 forward ops, 24 such saves, 92 ops through the
                cached mode (counted with a dispatch mode, 2026-11-24).
  early stop    the recompute stops at the last save (`_StopRecomputationError`, on by
                default): the ops from there on (`Layer.ops_after_last_save_fwd`; the
                op that saved an input included, inputs being saved before it runs) are
                not rerun: on gpt-tiny's block the last dropout's `mul` and the residual
                `add` (2 of 71 ops, counted with a dispatch mode, 2026-11-24). The
                `detach` a plain forward makes of a saved output (softmax's, 1 op of the
                block's 71, in `ops_fwd`) neither checkpointed pass makes: SELECTIVE's
                modes do not count it (`sac_mode_ops`), FULL prices it as rerun.

`checkpoint_host_seconds` probes each on the thread clock (`host_probes.probe_clock`) with
five chains of ops run through the same `checkpoint` call the executor makes: `y + 1`
(saves nothing; recomputed under SELECTIVE), `y * w` (saves `w`, a Python object),
`layer_norm(y)` (saves y, mean and rstd, the last two made in C++), `y @ w` (a matmul:
kept under SELECTIVE) and `block`, a repeated unit of the op kinds a zoo block runs
(norm, linear, view and transpose, scale, softmax, dropout, GELU, residual add). Each runs
at two lengths, and the ops, kept ops, saved tensors, saves requiring grad and ops after
the last save of each are counted (`ir.op_count.OpCounter`, `ir.saved_tensors.
SavedTensorLog`: what the layer IR counts), not assumed; each chain's input is a layer's
as a step hands it (`_input`, `ir.stand_in.step_input`: no input AccumulateGrad, as the
profile and the kernel records take a layer's); a least-squares fit over chains
and lengths splits each pass's difference with and without the machinery into per call,
per op and per saved tensor (per kept op, per op through SAC's cached mode for SELECTIVE).

SAC's caching mode costs more per op among a layer's activations than among the probe's
tiny tensors (the interpreter's objects and the mode's Python fall out of the caches the
op's data fills): its per-op figure is probed again at SIZED_ROWS x SIZED_WIDTH (a zoo
block's activation) and a layer's read at the bytes of its output (`selective_forward_op_
figures`, linear in bytes between the two sizes, flat beyond). Read on 2026-11-26 at load
4-6, one thread: the tiny chains 8.2 us per recomputed op and 12.2 per kept op, the chains
at (256, 64) fp32 11.8 and 16.4, at (32, 64) 8.0 and 11.2; a real gpt-tiny block's SAC
forward (sel fwd - full fwd, executor's `apply_ac`, 60 interleaved runs) 848 us at micro-
batch 1 ((32, 64) tensors), priced 626 from the tiny figures; 1033 us at micro-batch 8
((256, 64)), priced 651 from the tiny figures and 922 with the sized one.

`checkpoint_extra_seconds` prices a layer with them: counts from its kernel records
(`KernelRecords`: ops, and the ones `saved_under_selective` keeps) and its saved-tensor
log (`Layer.saved_tensors_fwd`, the pack calls of one forward; `saved_grad_tensors_fwd`;
`ops_after_last_save_fwd`). A layer IR without the last two (traced before them) prices
as before: every op rerun, no detach.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from cost_models.layer_memo import per_layer
from ir.kernel_calibration import KernelCalibration
from ir.strategy import Checkpoint

# Ops per probe chain at its two lengths: far enough apart that the slope is many ops'
# worth of time; short enough that a round stays under a scheduler quantum.
CHAIN_OPS = (2, 14)
# Chains SAC's recompute per op is fitted on: the one with a layer's op mix and the one
# whose ops SELECTIVE keeps. Per op through the cached mode, chain by chain (slope between
# the two lengths, 3 probes at load ~2, 2026-11-25): add 6.5-8.2 us (a Python-scalar
# operand), mul 4.4-4.9, layer_norm 4.2-4.9, block 4.4-4.6, mm 5.3-5.7: all chains in one
# fit gave 4.8-6.2 over 5 probes, swinging with the add chain's weight.
SAC_RECOMPUTE_CHAINS = ("block", "mm")
# The op a plain forward runs on a saved output (`KernelRecord.op`), which SAC never sees
DETACH_OP = "aten::detach"
# Width of the probe tensors (2 x width): tiny, so a kernel costs the host little beside
# its dispatch (as `cost_models.clusters.OP_OVERHEAD_WIDTH` does for the per-op probe).
PROBE_WIDTH = 8
PROBE_ROWS = 2  # rows of the chains' input: (2, PROBE_WIDTH)
# The sized chains (module docstring): a zoo block's activation, gpt-tiny's (8, 32, 64) at
# bench_validate's micro-batch 8 (batch x sequence rows), fp32: 64 KiB a tensor; only the
# chains with a layer's op mix and the kept op, FULL and SELECTIVE (their difference is
# SAC's forward: the kernels, run in both, cancel).
SIZED_ROWS, SIZED_WIDTH = 256, 64
SIZED_CHAINS = ("block", "mm")
# Bytes of one chain tensor at each size (fp32), the ends of `selective_forward_op_figures`
PROBE_TENSOR_BYTES = PROBE_ROWS * PROBE_WIDTH * 4
SIZED_TENSOR_BYTES = SIZED_ROWS * SIZED_WIDTH * 4
# The median of seven rounds: a slow spell of a shared host moves one of them. The probe
# costs ~1.2 s of one core at load ~3 (2026-11-25; 0.4 s before the `block` chain): little
# beside profile-device's minute.
ROUNDS = 7
RUNS_PER_ROUND = 10
WARMUP_RUNS = 5
# On a GPU machine (its host not shared) fewer rounds and runs: the probe must stay under
# ~5 s on a host ~2-3x slower per op than this one (the H100 host's launch 7-11 us,
# PythonDispatchMode 22.4 us per op, 2026-11-25), where 7 x 10 runs took 3.9 s here.
DEVICE_ROUNDS = {"cuda": (3, 5)}  # device -> (rounds, runs per round)


@dataclass(frozen=True, slots=True)
class CheckpointHostCost:
    """Host seconds of the checkpoint machinery, in the parts the module docstring names."""

    call_forward_s: float  # per checkpointed call, forward
    call_recompute_s: float  # per checkpointed call, backward (starting the recompute)
    op_forward_s: float  # per op run under the hooks, forward
    op_recompute_s: float  # per op run under the recompute's hooks, beyond its forward price
    saved_forward_s: float  # per saved tensor, forward (pack hook)
    saved_recompute_s: float  # per saved tensor, backward (recompute pack + unpack)
    selective_call_forward_s: float  # per SELECTIVE call on top of the above, forward
    selective_call_recompute_s: float  # per SELECTIVE call on top of the above, recompute
    selective_forward_op_s: float  # per op through the caching mode, output recomputed later
    selective_forward_kept_op_s: float  # per op through the caching mode, output kept
    selective_recompute_op_s: float  # per op through the cached mode in the recompute
    selective_forward_op_sized_s: float = 0.0  # per op through the caching mode, recomputed,
    # at SIZED_TENSOR_BYTES (a kept op pays the same increase over its tiny figure)

    def calibration_fields(self) -> dict[str, float]:
        """`KernelCalibration` fields, by name (CHECKPOINT_FIELDS' order): SELECTIVE's call
        as its two halves and, for readers before them, their sum (`selective_call_s`)."""
        return dict(zip(CHECKPOINT_FIELDS, (
            self.call_forward_s, self.call_recompute_s, self.op_forward_s,
            self.op_recompute_s, self.saved_forward_s, self.saved_recompute_s,
            self.selective_call_forward_s + self.selective_call_recompute_s,
            self.selective_forward_op_s, self.selective_forward_kept_op_s,
            self.selective_recompute_op_s, self.selective_call_forward_s,
            self.selective_call_recompute_s, self.selective_forward_op_sized_s),
            strict=True))


# The `KernelCalibration` fields this probe writes.
CHECKPOINT_FIELDS = ("checkpoint_call_forward_s", "checkpoint_call_recompute_s",
                     "checkpoint_op_forward_s", "checkpoint_op_recompute_s",
                     "checkpoint_saved_forward_s", "checkpoint_saved_recompute_s",
                     "selective_call_s", "selective_forward_op_s",
                     "selective_forward_kept_op_s", "selective_recompute_op_s",
                     "selective_call_forward_s", "selective_call_recompute_s",
                     "selective_forward_op_sized_s")


def probed(cal: KernelCalibration | None) -> bool:
    """True when a calibration carries the probe's figures (specs before it read 0 in
    every one; the fit clamps each at 0, so any single one may read 0 when probed)."""
    return cal is not None and any(getattr(cal, field) > 0 for field in CHECKPOINT_FIELDS)


def kept_ops(layer) -> int:
    """Forward ops whose output SELECTIVE keeps (`ir.checkpoint_policy`)."""
    return sum(r.count for r in layer.kernels.forward if r.saved_under_selective)


@per_layer
def rerun_ops(layer) -> int:
    """Forward ops the recompute reruns: all but those from the last save on (early stop,
    `torch.utils.checkpoint._recomputation_hook`'s `_StopRecomputationError`)."""
    return max(layer.ops_fwd - layer.ops_after_last_save_fwd, 0)


def cached_mode_ops(layer) -> int:
    """Ops through SAC's cached mode in the recompute: the ops rerun and the `detach` its
    pack hook makes of each saved tensor requiring grad (`_recomputation_hook.pack_hook`)."""
    return rerun_ops(layer) + layer.saved_grad_tensors_fwd


def forward_detaches(layer) -> int:
    """The plain forward's detaches of saved outputs (softmax's, rsqrt's: `aten::detach`
    records, in `ops_fwd`), which neither checkpointed pass makes."""
    records = layer.kernels.forward if layer.kernels is not None else ()
    return sum(r.count for r in records if r.op == DETACH_OP)


def sac_mode_ops(layer) -> tuple[int, int]:
    """(forward, recompute) ops through SAC's caching and cached dispatch modes: the
    forward's ops and `cached_mode_ops`, each less `forward_detaches` (llama-tiny's block:
    117 - 3 and 148 - 3, as a counter on the modes reads, 2026-11-25)."""
    detaches = forward_detaches(layer)
    return max(layer.ops_fwd - detaches, 0), max(cached_mode_ops(layer) - detaches, 0)


def selective_forward_op_figures(cal: KernelCalibration,
                                 tensor_bytes: float) -> tuple[float, float]:
    """(per recomputed op, per kept op) seconds through SAC's caching mode for a layer whose
    ops make tensors of `tensor_bytes`: the tiny chains' figures at PROBE_TENSOR_BYTES and
    below; above, each + the sized chains' increase per recomputed op (the mode's Python
    among larger data, which a kept op runs too) x the share of the way to
    SIZED_TENSOR_BYTES, linear in bytes, flat beyond (probed at both ends and at (32, 64):
    8 KiB read as the tiny figure, module docstring). The sized kept-op figure is not used:
    its fit swung 3-19 us over three probes (the kept matmuls' kernels dominate the chain).
    A calibration without the sized figure: the tiny ones."""
    op_s, kept_s = cal.selective_forward_op_s, cal.selective_forward_kept_op_s
    if cal.selective_forward_op_sized_s <= 0:
        return op_s, kept_s
    share = min(max((tensor_bytes - PROBE_TENSOR_BYTES)
                    / (SIZED_TENSOR_BYTES - PROBE_TENSOR_BYTES), 0.0), 1.0)
    increase_s = share * (cal.selective_forward_op_sized_s - op_s)
    return op_s + increase_s, kept_s + increase_s


@per_layer
def checkpoint_extra_seconds(layer, mode: Checkpoint, cal: KernelCalibration,
                             config=None) -> tuple[float, float]:
    """(forward, recompute) host seconds the checkpoint machinery adds to one micro-batch
    of `layer` under `mode`, on top of the layer's own ops (which the recompute pays again
    at their forward price, `host_dispatch.forward_host_seconds`, less the early-stopped ones).
    Counts: the forward's saved tensors (`saved_tensors_fwd`), its ops (`ops_fwd`), those
    the recompute reruns (`rerun_ops`), those SELECTIVE keeps, those through its cached
    mode (`cached_mode_ops`). SAC's forward per op is read at the layer's output bytes at
    `config`'s micro-batch and dtype (`StepConfig`; None: as the IR measured it)."""
    if mode is Checkpoint.NONE or not probed(cal):
        return 0.0, 0.0
    saved, ops, rerun = layer.saved_tensors_fwd, layer.ops_fwd, rerun_ops(layer)
    # Probed per call, per op and per saved tensor (checkpoint_probes.checkpoint_host_seconds)
    forward_s = (cal.checkpoint_call_forward_s + ops * cal.checkpoint_op_forward_s
                 + saved * cal.checkpoint_saved_forward_s)
    recompute_s = (cal.checkpoint_call_recompute_s + rerun * cal.checkpoint_op_recompute_s
                   + saved * cal.checkpoint_saved_recompute_s)
    if mode is Checkpoint.SELECTIVE:
        kept = kept_ops(layer) if layer.kernels is not None else 0
        call_forward_s, call_recompute_s = cal.selective_call_halves()
        sac_forward, sac_recompute = sac_mode_ops(layer)
        # the boundary's bytes as the ops' size: a proxy, whole under TP (shards are smaller)
        tensor_bytes = layer.output_bytes * (config.activation_scale if config else 1.0)
        op_s, kept_op_s = selective_forward_op_figures(cal, tensor_bytes)
        # Probed per op through SAC's caching / cached dispatch modes (checkpoint_host_seconds)
        forward_s += (call_forward_s + kept * kept_op_s + max(sac_forward - kept, 0) * op_s)
        recompute_s += call_recompute_s + sac_recompute * cal.selective_recompute_op_s
    return forward_s, recompute_s


# ---- the probe ---------------------------------------------------------------------------


def _chains(torch, device: str = "cpu", rows: int = PROBE_ROWS, width: int = PROBE_WIDTH):
    """name -> chain(x, n), its tensors on `device`: n ops of one kind on x, then `sin` (which saves its input: the
    backward then unpacks a saved tensor, which starts the recompute). Per op: `add` saves
    nothing, `mul` one tensor with a Python object (`w`), `layer_norm` three of which two
    (mean, rstd) exist only in C++ (a hook gives each a Python object, as it does most of
    a layer's saves); `mm` is kept under SELECTIVE. `block`: n units of a zoo block's op
    kinds in its order (`planner.zoo.gpt.Block`: norm, linear on a 3-D input, transpose,
    scale, softmax, dropout, GELU, residual add; 16 ops, one kept), so the fit sees ops
    with the argument counts, views and saves of a real layer's forward."""
    import torch.nn.functional as F

    w_mul = torch.full((rows, width), 1.0001, device=device)
    w_mm = torch.eye(width, device=device)
    w_linear = torch.eye(width, device=device, requires_grad=True)  # gets a gradient
    b_linear = torch.zeros(width, device=device, requires_grad=True)

    def add(x, n):
        for _ in range(n):
            x = x + 1.0
        return x.sin()

    def mul(x, n):
        for _ in range(n):
            x = x * w_mul
        return x.sin()

    def layer_norm(x, n):
        for _ in range(n):
            x = F.layer_norm(x, (width,))
        return x.sin()

    def mm(x, n):
        for _ in range(n):
            x = x @ w_mm
        return x.sin()

    def block(x, n):
        x = x.view(1, rows, width)  # (1, rows, W): a (batch, sequence, hidden) activation
        for _ in range(n):
            h = F.linear(F.layer_norm(x, (width,)), w_linear, b_linear)
            a = F.softmax(h.transpose(1, 2) * 0.5, dim=-1)  # (1, W, 2)
            a = F.dropout(a, 0.1, training=True)
            x = x + F.gelu(a.transpose(1, 2))
        return x.sin()

    return {"add": add, "mul": mul, "layer_norm": layer_norm, "mm": mm, "block": block}


def _input(torch, device: str = "cpu", rows: int = PROBE_ROWS, width: int = PROBE_WIDTH):
    """A chain's input as a checkpointed layer of a step gets it (`ir.stand_in.step_input`:
    an activation, no input AccumulateGrad in its backward), as `planner profile` and the
    kernel records hand each layer's."""
    from ir.stand_in import step_input

    return step_input(torch.ones(rows, width, device=device))


def _runner(torch, chain, n: int, mode: Checkpoint):
    """One forward and one backward of `chain` at length n, checkpointed as the executor
    does (`executors.checkpointing.apply_ac`): returns (forward(x), backward()) callables."""
    import functools

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from ir.checkpoint_policy import selective_policy

    context_fn = functools.partial(create_selective_checkpoint_contexts, selective_policy)
    holder = {}

    def forward(x):
        if mode is Checkpoint.NONE:
            holder["y"] = chain(x, n)
        elif mode is Checkpoint.FULL:
            holder["y"] = checkpoint(chain, x, n, use_reentrant=False)
        else:
            holder["y"] = checkpoint(chain, x, n, use_reentrant=False, context_fn=context_fn)

    def backward():
        y = holder.pop("y")
        y.backward(torch.ones_like(y))

    return forward, backward


@dataclass(frozen=True, slots=True)
class ChainCounts:
    """What one plain forward of a probe chain dispatches and saves, counted as the layer
    IR counts it (`ir.op_count.OpCounter` with its kernel recorder; `SavedTensorLog`)."""

    ops: int
    kept: int  # ops SELECTIVE keeps
    saved: int  # pack calls
    saved_grad: int  # of them, tensors requiring grad (the recompute detaches each)
    after_last_save: int  # ops the recompute's early stop skips
    detaches: int = 0  # of the ops, detaches of saved outputs (`forward_detaches`)

    @property
    def rerun(self) -> int:  # as `rerun_ops` counts a layer's
        return self.ops - self.after_last_save

    @property
    def cached_mode(self) -> int:  # as `cached_mode_ops` counts a layer's
        return self.rerun + self.saved_grad

    @property
    def sac_modes(self) -> tuple[int, int]:  # as `sac_mode_ops` counts a layer's
        return self.ops - self.detaches, self.cached_mode - self.detaches


def _counts(torch, chain, n: int, device: str = "cpu", rows: int = PROBE_ROWS,
            width: int = PROBE_WIDTH) -> ChainCounts:
    """The counts of one plain forward of `chain` at length n on `device` (a CUDA
    dropout is one `native_dropout`, a CPU one four ops: counted where it runs). Ops come from a run
    without hooks (a saved output's forward `detach` goes with them, as in the layer IR's
    op count, `ir.graph_measurer`); saves and the ops from the last save on from a run
    under the log's hooks, as the IR's saved-tensor counts (`ir.graph_measurer`)."""
    from ir.kernel_recorder import KernelRecorder
    from ir.op_count import OpCounter
    from ir.saved_tensors import SavedTensorLog

    recorder = KernelRecorder(set())
    x = _input(torch, device, rows, width)
    with OpCounter(recorder) as ops:
        chain(x, n)
    log = SavedTensorLog(set(), set())
    with torch.autograd.graph.saved_tensors_hooks(log.pack, log.unpack), log.ops:
        chain(x, n)
    kept = sum(r.count for r in recorder.records() if r.saved_under_selective)
    detaches = sum(r.count for r in recorder.records() if r.op == DETACH_OP)
    return ChainCounts(ops.count, kept, log.calls, log.grad_calls, log.ops_after_last_save,
                       detaches)


def _fit(rows) -> list[float]:
    """Least-squares coefficients of `seconds = sum(coefficient x count)` over rows of
    (counts, seconds), each clamped at 0 (a cost is never negative; noise can make one)."""
    import numpy as np

    counts = np.array([c for c, _ in rows], dtype=float)
    seconds = np.array([t for _, t in rows], dtype=float)
    coefficients = np.linalg.lstsq(counts, seconds, rcond=None)[0]
    return [max(0.0, float(c)) for c in coefficients]


def _timed(torch, runs, clock, device: str = "cpu", rows: int = PROBE_ROWS,
           width: int = PROBE_WIDTH) -> dict:
    """Median (forward, backward) seconds of each run over ROUNDS rounds of
    RUNS_PER_ROUND (DEVICE_ROUNDS' on a GPU), every run taking each place in the order in turn (the first after a
    pause runs up to ~3x slower: caches)."""
    for _ in range(WARMUP_RUNS):
        for forward, backward in runs.values():
            forward(_input(torch, device, rows, width))
            backward()
    rounds = {key: ([], []) for key in runs}
    order = list(runs)
    n_rounds, per_round = DEVICE_ROUNDS.get(device, (ROUNDS, RUNS_PER_ROUND))
    for _ in range(n_rounds):
        sums = {key: [0.0, 0.0] for key in runs}
        for _ in range(per_round):
            order = order[1:] + order[:1]
            for key in order:
                forward, backward = runs[key]
                x = _input(torch, device, rows, width)  # the input, made untimed
                start = clock()
                forward(x)
                mid = clock()
                backward()
                sums[key][0] += mid - start
                sums[key][1] += clock() - mid
        for key, (forward_s, backward_s) in sums.items():
            rounds[key][0].append(forward_s / per_round)
            rounds[key][1].append(backward_s / per_round)
    return {key: (statistics.median(f), statistics.median(b)) for key, (f, b) in rounds.items()}


def checkpoint_host_seconds(device: str = "cpu") -> CheckpointHostCost:
    """Probe the checkpoint machinery's host seconds on `device` ("cpu": one thread;
    "cuda": the same chains on the GPU, timed on the host's wall clock, which tiny
    kernels leave host-bound: what a GPU step's host pays, SAC's ~22 us per op on the
    H100 host of 2026-11-25 included).
    Each chain runs at CHAIN_OPS lengths under NONE, FULL and SELECTIVE; with T the
    median seconds and (ops, kept, saved) the chain's counts (`_counts`), least squares
    over every chain and length (`_fit`) of:
      FULL forward:     T_full - T_none                = call + ops x per op + saved x per saved
      FULL recompute:   T_full,bwd - T_none,bwd - T_none,fwd x rerun / ops  (the ops rerun
                        again at their plain forward price) = call + rerun x per op
                                                         + saved x per saved
      SELECTIVE fwd:    T_sel - T_full                 = call + recomputed ops x per op
                                                         + kept ops x per kept op
                        (of the ops through the caching mode: `sac_mode_ops`)
      SELECTIVE bwd:    T_sel,bwd - T_full,bwd         = call + cached-mode ops x per op
                        (`sac_mode_ops`: the ops rerun and the recompute's detaches;
                        on the SAC_RECOMPUTE_CHAINS only;
                        kept ops, which skip their kernel, fit apart and are not kept:
                        the model charges them the cached mode's per op, and their plain
                        host dispatch, a bound of ~1 us each)."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    modes = (Checkpoint.NONE, Checkpoint.FULL, Checkpoint.SELECTIVE)
    with _one_thread():
        chains = _chains(torch, device)
        counts = {(name, n): _counts(torch, chain, n, device)
                  for name, chain in chains.items() for n in CHAIN_OPS}
        runs = {(name, n, mode): _runner(torch, chain, n, mode)
                for name, chain in chains.items() for n in CHAIN_OPS for mode in modes}
        t = _timed(torch, runs, probe_clock(device), device)
        sized = _chains(torch, device, SIZED_ROWS, SIZED_WIDTH)
        sized_counts = {(name, n): _counts(torch, sized[name], n, device, SIZED_ROWS, SIZED_WIDTH)
                        for name in SIZED_CHAINS for n in CHAIN_OPS}
        sized_runs = {(name, n, mode): _runner(torch, sized[name], n, mode)
                      for name in SIZED_CHAINS for n in CHAIN_OPS for mode in modes[1:]}
        t_sized = _timed(torch, sized_runs, probe_clock(device), device, SIZED_ROWS,
                         SIZED_WIDTH)
    none, full, sel = modes
    fwd_rows, rec_rows, sel_fwd_rows, sel_rec_rows = [], [], [], []
    for (name, n), c in counts.items():
        fwd_rows.append(((1, c.ops, c.saved), t[name, n, full][0] - t[name, n, none][0]))
        rec_rows.append(((1, c.rerun, c.saved), t[name, n, full][1] - t[name, n, none][1]
                         - t[name, n, none][0] * c.rerun / c.ops))
        sac_forward, sac_recompute = c.sac_modes
        sel_fwd_rows.append(((1, sac_forward - c.kept, c.kept),
                             t[name, n, sel][0] - t[name, n, full][0]))
        if name in SAC_RECOMPUTE_CHAINS:
            sel_rec_rows.append(((1, sac_recompute, c.kept),
                                 t[name, n, sel][1] - t[name, n, full][1]))
    call_forward_s, op_forward_s, saved_forward_s = _fit(fwd_rows)
    call_recompute_s, op_recompute_s, saved_recompute_s = _fit(rec_rows)
    sel_call_forward_s, sel_op_s, sel_kept_op_s = _fit(sel_fwd_rows)
    sel_call_recompute_s, sel_recompute_op_s, _ = _fit(sel_rec_rows)
    # SAC's forward again at the sized chains' tensors: the same fit, its per-op figures
    _, sized_op_s, _ = _fit(
        [((1, c.sac_modes[0] - c.kept, c.kept), t_sized[name, n, sel][0] - t_sized[name, n, full][0])
         for (name, n), c in sized_counts.items()])
    return CheckpointHostCost(
        call_forward_s=call_forward_s, call_recompute_s=call_recompute_s,
        op_forward_s=op_forward_s, op_recompute_s=op_recompute_s,
        saved_forward_s=saved_forward_s, saved_recompute_s=saved_recompute_s,
        selective_call_forward_s=sel_call_forward_s,
        selective_call_recompute_s=sel_call_recompute_s,
        selective_forward_op_s=sel_op_s, selective_forward_kept_op_s=sel_kept_op_s,
        selective_recompute_op_s=sel_recompute_op_s, selective_forward_op_sized_s=sized_op_s)
