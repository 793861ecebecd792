"""Measured per-layer profiles: run each unique layer for real and time it.

`planner profile` writes the result as JSON (schema "planner.profile/v1"); the compute
model reads it back and prefers its seconds over the analytic FLOP-rate estimate.

    {"schema": "planner.profile/v1", "model": str, "fingerprint": str, "device": "cpu",
     "device_name": str, "dtype": "float32", "micro_batch": int, "seq_len": int|null,
     "layers": [{"name", "structural_hash", "micro_batch", "forward_seconds",
                 "backward_seconds", "saved_activation_bytes", "flops_fwd", "flops_bwd",
                 "node_span_seconds", "node_span_spread"}]}

Only the layer being measured and its two step neighbours (`StepNeighbours`) are
materialised (parameters and inputs drawn at random in the profile dtype), so a model far
larger than the device still profiles layer by layer.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from typing import Callable

import torch

from ir.errors import PlannerError
from ir.graph_measurer import GraphMeasurer, _clear_grads
from ir.layer import LayerGraph
from ir.measure import layer_graph_from_trace
from ir.op_count import recent_window_layers
from ir.stand_in import TensorFactory, real_factory
from ir.trace import trace

from cost_models.autograd_engine import (ENGINE_PROBE_OPS, EngineSampler, NodeSpan,
                                         net_backward_seconds)

PROFILE_SCHEMA = "planner.profile/v1"
DEFAULT_WARMUP = 2  # first runs pay for allocator growth and kernel selection
DEFAULT_REPEATS = 5  # the median of five is robust to one noisy run
# Rounds of the node-span probe (`autograd_engine.EngineSampler`, `nodes_only`: graphs of
# 1, 2, 4 and 8 ops) per layer run, run right after the layer's runs: with five repeats,
# 20 backwards per graph size for the fit; ~0.12 ms a round here (one thread,
# 2026-11-25). Not between the runs: there the next forward ran after the probe instead
# of after its own backward and read slower (A/B in one process, 6 alternations, load 11,
# 2026-11-25: mlp-small's block at micro-batch 4 12.8 -> 14.9 us forward, dlrm's table
# 17.8 -> 24.6; after the runs, 12.8 and 17.6, as without the probe).
ENGINE_ROUNDS_PER_REPEAT = 4
# The start's spread is over this many equal runs of those rounds (each fit on a third:
# 1-4% here for gpt-tiny's small layers at nine repeats, where a fit per repeat, four
# backwards per size, read 4-102%: its own noise, not the host's).
ENGINE_SPREAD_BLOCKS = 3


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def profile_layers(module, inputs, target, loss_fn, *, name: str, device: str = "cpu",
                   dtype: torch.dtype = torch.float32, warmup: int = DEFAULT_WARMUP,
                   repeats: int = DEFAULT_REPEATS,
                   progress: Callable[[int, int, str], None] | None = None) -> dict:
    """Time forward and backward of every unique layer on `device`; the profile document."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise PlannerError("--device cuda: no CUDA device is available here; use --device cpu")
    if repeats < 1 or warmup < 0:
        raise PlannerError(f"--repeats must be >= 1 and --warmup >= 0 (got {repeats}, {warmup})")
    traced = trace(module, inputs, target, loss_fn, dtype=dtype)
    graph, measurer = layer_graph_from_trace(traced, inputs, target, name=name, dtype=dtype)
    layers = profile_graph(graph, measurer, device, warmup=warmup, repeats=repeats,
                           progress=progress)
    return {"schema": PROFILE_SCHEMA, "model": graph.model, "fingerprint": graph.fingerprint,
            "device": device.split(":")[0], "device_name": device_name(device),
            "dtype": graph.dtype, "micro_batch": graph.micro_batch, "seq_len": graph.seq_len,
            "layers": layers}


def profile_graph(graph: LayerGraph, measurer: GraphMeasurer, device: str, *,
                  warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS,
                  progress: Callable[[int, int, str], None] | None = None,
                  clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    """The profile's "layers" entries of a measured graph: each unique layer timed once,
    on `clock` (`time_layer`'s; a bench on a shared host passes the probes' thread clock,
    `host_probes.probe_clock`)."""
    factory = real_factory(device)
    layers, seen = [], {}
    for i, layer in enumerate(graph.layers):
        if progress:
            progress(i, len(graph.layers), layer.name)
        if layer.structural_hash in seen:
            continue
        col, row = measurer.tp_modules(i, layer.tp_candidates)
        state = measurer.layer_state(i, factory)  # this layer's tensors, on the device
        measured = measurer.measure_layer(i, col, row, factory=factory, state=state)
        engine = EngineSampler(device, clock, nodes_only=True)
        forward_s, backward_s = time_layer(measurer, i, state, factory, device,
                                           warmup=warmup, repeats=repeats, name=layer.name,
                                           engine=engine, layers=graph.layers, clock=clock)
        span = (engine.result(ENGINE_SPREAD_BLOCKS) if engine.samples[ENGINE_PROBE_OPS[0]]
                else None)
        seen[layer.structural_hash] = True
        layers.append({
            "name": layer.name, "structural_hash": layer.structural_hash,
            "micro_batch": graph.micro_batch, "forward_seconds": forward_s,
            "backward_seconds": backward_s,
            "saved_activation_bytes": measured.saved_activation_bytes,
            "flops_fwd": measured.flops_fwd, "flops_bwd": measured.flops_bwd,
            # the span's own cost the backward left out (0 without one; `time_layer`), and
            # how steady it was in the loop
            "node_span_seconds": span.seconds if span else 0.0,
            "node_span_spread": span.spread if span else 0.0,
        })
    return layers


def time_layer(measurer: GraphMeasurer, index: int, state: dict, factory: TensorFactory,
               device: str, *, warmup: int, repeats: int,
               name: str | None = None,
               engine: EngineSampler | None = None,
               layers: list | None = None,
               clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median (forward, backward) seconds of layer `index` over `repeats` runs after
    `warmup` untimed ones (the instrumented `measure_layer` run before them warms up too).
    The forward is the layer's own GraphModule (`GraphMeasurer.layer_module`: generated
    Python calling the modules, as the executor runs them), not the node-by-node
    interpreter that `measure_layer` needs for its per-node hooks: that one costs ~10 us
    of Python per node, which no training step pays. The runs go without the FLOP and op
    counters and saved-tensor hooks: they cost a Python call per op, more than a small
    op itself. Each timed pass follows, untimed, the work a step runs just before it
    (`StepNeighbours`: the forwards of the layers before whose ops a step leaves warm,
    read off `layers` (the graph's, else the layer before alone)); its backward runs in
    ONE engine call after the nodes of the layers whose backwards a step runs just before
    it (their forwards run after the timed one), as a step runs it, and is timed from its
    first node to the node after its last (`autograd_engine.NodeSpan`): no engine start or
    end in it (a step pays them once per micro-batch and stage, not once per layer, and
    the compute model sums layers), and no Python between its nodes and theirs; its
    inputs are activations, not leaves (`ir.stand_in.StepInput`): no AccumulateGrad for
    them, whose nodes run after the span, as a step hands their gradients to the layer
    before. The span's own cost (its two stamps) is measured right after these runs, on this clock: ENGINE_ROUNDS_PER_REPEAT rounds of
    `autograd_engine.EngineSampler`'s probe graphs per run, timed by the same span, the
    line through them giving it (`engine`, when given: the sampler to fill, for a caller
    that reports it); the backward is the median run less it (`net_backward_seconds`: a
    result at or below 0 raises, never a silent 0; a layer whose outputs need no gradient
    has no backward: 0). Each run starts with every parameter's `.grad` set to None (untimed), as a
    training step's first micro-batch does after
    `zero_grad(set_to_none=True)`: the backward steals each new gradient (a detach)
    instead of running one `add_` per parameter into the last run's gradient, which a
    repeated backward would time and no step's first micro-batch runs (llama-tiny's
    block: 9 parameters, ~30 us on this CPU; the kernel records clear it alike,
    `ir.graph_measurer`)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    module = measurer.layer_module(index, state)
    engine = engine if engine is not None else EngineSampler(device, clock, nodes_only=True)
    neighbours = StepNeighbours(measurer, index, factory, layers, device)  # as a step runs it
    forward_s, backward_s = [], []
    for rep in range(warmup + repeats):
        _clear_grads(state)  # a step's first micro-batch: no gradient to accumulate into
        neighbours.before_forward()
        # drawn after the neighbours, as a step's layer reads what the layer before just
        # wrote (drawn before, norms' forwards read 6-25% slower: gpt-tiny's at mb 1
        # 10.7-11.4 us against 8.5-9.6, bench_kernel_model x4 each, load 3.5-7, 2026-11-25)
        inputs = measurer.fresh_inputs(index, state, factory)
        # after the inputs' nodes (`ir.stand_in.StepInput`, where a step has the layer
        # before's), before the layer's: its node runs after the layer's, theirs after it
        span = NodeSpan(device, clock, sync)
        sync()
        start = clock()
        returned = module(*inputs)
        sync()
        mid = clock()
        outs = measurer.module_roots(index, returned)
        ahead = neighbours.before_backward()  # the window's roots: its nodes run first
        # made after the neighbours' work, as a step makes a gradient just before the nodes
        # that read it (made before it, dlrm's tables.0 read 1.2 us slower: load 6)
        roots = ahead + outs + [span.root] if span.arm(outs) else []
        seeds = [torch.ones_like(t) for t in roots]
        if roots:
            torch.autograd.backward(roots, seeds)  # one call, as a step's
        neighbours.after_backward()
        if rep >= warmup:
            forward_s.append(mid - start)
            if roots:
                backward_s.append(span.seconds())
        del inputs, returned, outs, seeds, ahead, roots, span
    if not backward_s:
        return statistics.median(forward_s), 0.0
    for rep in range(warmup + repeats):  # after the runs: between them it slowed the forward
        for _ in range(ENGINE_ROUNDS_PER_REPEAT):
            engine.sample(keep=rep >= warmup)
    layer = name if name is not None else f"#{index}"
    return statistics.median(forward_s), net_backward_seconds(backward_s, engine.result(),
                                                              layer)


def step_neighbours(measurer: GraphMeasurer, index: int) -> tuple[int | None, int | None]:
    """The layers whose work a step runs just before layer `index`'s forward (the layer
    before it) and just before its backward (the layer after it), as most layers with its
    structural hash have them (`profile_graph` times one of them for all: a stack's
    blocks follow a block, not the embedding before the first), each as the index of its
    first such occurrence's neighbour; None where that is the step's edge (the first
    layer's forward follows the last step's backward of it and the optimizer, the last
    layer's backward its own forward: `time_layer`'s runs already go so)."""
    same = [j for j in range(len(measurer.layers))
            if measurer.structural_hash(j) == measurer.structural_hash(index)]

    def most_common(offset: int) -> int | None:
        near = [j + offset for j in same if 0 <= j + offset < len(measurer.layers)]
        if len(near) < len(same) / 2:  # most occurrences sit at the step's edge
            return None
        hashes = [measurer.structural_hash(k) for k in near]
        best = max(hashes, key=hashes.count)  # ties: the first occurrence's
        return near[hashes.index(best)]

    return most_common(-1), most_common(+1)


def forward_window(layers: list, before: int | None) -> list[int]:
    """The layers whose forwards a step runs, in order, just before the forward of the layer
    after `before` and leaves warm for it (`ir.op_count.recent_window_layers` over their
    forward ops, `Layer.measured.forward_overloads`: the ones `Layer.cold_distinct_ops_fwd`
    is counted against), ending with `before`; [] for None (the step's first layer)."""
    if before is None:
        return []
    previous = [layers[j].measured.forward_overloads for j in range(before, -1, -1)]
    return list(range(before - recent_window_layers(previous) + 1, before + 1))


def backward_window(layers: list, after: int | None) -> list[int]:
    """The layers whose backwards a step runs, nearest last, just before the backward of
    the layer before `after` and leaves warm for it (`ir.op_count.recent_window_layers`
    over their backward ops, as `Layer.cold_distinct_ops_bwd` is counted), starting with
    `after`, in step (forward) order; [] for None (the step's last layer)."""
    if after is None:
        return []
    following = [layers[j].measured.backward_overloads for j in range(after, len(layers))]
    return list(range(after, after + recent_window_layers(following)))


class StepNeighbours:
    """Runs, untimed, what a step runs between a layer's work and that of its neighbour
    (`step_neighbours`): the forwards of the layers before it ahead of its timed forward
    (`forward_window` where `layers`, the graph's, are given: a head after a norm after a
    block, as the cold ops are counted; else the layer before alone); between its timed
    forward and backward, the forwards of the layers after it whose backwards its own
    follows (`backward_window`; else the layer after alone), for the timed call to run
    their nodes first; after the step's last layer's backward, the forwards and
    backwards of the layers before it. A layer timed
    right after its own backward, as `time_layer` ran each before, pays for code a step
    runs warm (bench/bench_in_sequence.py: 3-7 us per distinct op run once after other
    code), and one timed after nothing misses what a step's neighbours evict (each
    neighbour's state is materialised too). A head timed after the norm alone ran warmer
    than in a step (gpt-tiny, thread clock, load 1-4, 2026-11-25: 24 / 44 / 125 us at
    micro-batch 1 / 4 / 16 profiled, 35 / 63 / 194 in whole steps: bench_host_ab.py)."""

    def __init__(self, measurer: GraphMeasurer, index: int, factory: TensorFactory,
                 layers: list | None = None, device: str = "cpu"):
        self.measurer, self.factory, self.device = measurer, factory, device
        before, after = step_neighbours(measurer, index)
        self.befores = (forward_window(layers, before) if layers is not None
                        else [] if before is None else [before])
        self.afters = (backward_window(layers, after) if layers is not None
                       else [] if after is None else [after])
        self.runs = {}  # index -> (its module, its state)
        for j in set(self.befores) | set(self.afters):
            state = measurer.layer_state(j, factory)
            self.runs[j] = (measurer.layer_module(j, state), state)
        self.after = after

    def _forward(self, j: int) -> list[torch.Tensor]:
        module, state = self.runs[j]
        _clear_grads(state)
        return self.measurer.module_roots(j, module(*self.measurer.fresh_inputs(
            j, state, self.factory)))

    def before_forward(self) -> None:
        for j in self.befores:  # in step order; each output dropped as the next runs
            self._forward(j)

    def before_backward(self) -> list[torch.Tensor]:
        """The forwards of the layers whose backwards a step runs just before this layer's
        (`afters`), in step order; their roots, for the caller's timed call to run their
        nodes first, then the layer's, in ONE engine call as a step does. Each in its own
        call, with the engine's start warmed, the layer's nodes read 10-17 us more than
        in a step: t5-tiny's encoder_norm at micro-batch 1 64-66 us, in one call after the
        same window 48-49, in a real step 45-50 (bench/bench_backward_neighbours.py, load
        5-10, 2026-11-25): the Python between two calls (the wrapper, the seeds, the
        sine) leaves its rsqrt's, mean's and pow's backwards ~5 us each slower, the
        others alike (per-node pre-hook stamps, bench/bench_backward_call.py)."""
        return [t for j in self.afters for t in self._forward(j)]

    def after_backward(self) -> None:
        """For the step's last layer, the forwards then backwards of the layers before it
        (`befores`, the nearest's backward first), as a step runs their backwards after
        its backward: its next backward then finds the ops its forward did not run cold,
        as `ir.op_count.cold_distinct_ops_bwd` counts them. Timed right after its forward
        and the layers before's forwards alone, cnn-small's head read 31-33 us at
        micro-batch 1, 38 so; gpt-tiny's 39 and 42, llama-tiny's 42 and 44, where one
        engine call of a real step spent 34, 42 and 48 (bench/bench_profile_step.py,
        load 3-6, 2026-11-25). Nothing for the other layers: what a step runs after their
        backward is not what theirs is counted against."""
        if self.afters:
            return
        roots = {j: self._forward(j) for j in self.befores}
        for j in reversed(self.befores):
            self._backward(roots[j])

    def _backward(self, roots: list[torch.Tensor]) -> None:
        if roots:
            torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])


def save_profile(profile: dict, path: str) -> None:
    """Write atomically: a half-written file never replaces a good one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".profile-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(profile, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_profile(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise PlannerError(f"profile {path!r} does not exist; write one with `planner profile`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlannerError(f"profile {path!r} is not valid JSON ({exc}); re-run `planner profile`") from None
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise PlannerError(f"profile {path!r}: schema is {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                           f"expected {PROFILE_SCHEMA!r}")
    for i, layer in enumerate(doc.get("layers", [])):
        for key in ("structural_hash", "forward_seconds", "backward_seconds", "micro_batch"):
            if key not in layer:
                raise PlannerError(f"profile {path!r}: layers[{i}] has no {key!r}")
    return doc
