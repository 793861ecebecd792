"""Check every tensor-parallel layer against its unsharded self before the first step.

A split can run and still be wrong: attention code that reshapes with a global head
count after its projections were split (OPT's `self.num_heads`) mixes heads silently.
So, on every rank (same model, same seed, same example inputs):

    record   before anything is pruned or split, the whole model runs once on the first
             CHECK_ROWS rows of the example inputs (eval mode, no grad); forward hooks
             keep each tensor-parallel layer's (args, kwargs, output);
    check    right after `apply_tp`, each such layer runs on its recorded inputs (under
             sequence parallelism its main input is this rank's sequence chunk) and its
             main output (gathered where split) is compared with the recorded one; a
             fused projection split per part (`executors.fused`) must also gather back,
             in the model's order, to its recorded unsplit weights exactly: what full
             state dicts and checkpoints rely on.

The largest differences are all-reduced over the world, so every rank raises the same
`PlannerError` naming the first layer off by more than the dtype's tolerance. Rank 0
prints the check's cost once.

Re-layouts (`executors.layout`: the hooks that convert an activation between
neighbouring layers laid out differently, e.g. TP+SP to TP) are checked too, once the
hooks are placed (`check_relayouts`): each runs once, forward and backward, on a small
random global activation (the same on every rank), and this rank's piece of its result
and of its input gradient must equal the pieces cut from the global tensors directly.
A re-layout only moves data, so any difference is a PlannerError naming the layer. `apply(..., tp_self_check=False)` turns it off; it is
skipped (and says so) without example inputs, on a meta model, or above MAX_CHECK_PARAMS.

    >>> check = TPSelfCheck.record(model, plan, graph, example_inputs, stages=1)
    >>> apply_tp(...); check.check(stage_module, layers, plan, graph, meshes)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_flatten, tree_map

from executors import layout as layouts
from executors.fused import FUSED_ATTR, full_in_model_order
from executors.layout import BATCH_DIM, SEQ_DIM, Layout, map_main_input
from executors.mesh import Meshes
from executors.validate import layer_layout
from ir.legality import sequence_parallel_applies
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.plan import ParallelPlan

CHECK_ROWS = 1  # one sample shows a wrong split as well as many, at the least cost
# The record runs the whole model forward once on every rank: ~2·params·tokens FLOPs,
# seconds on a GPU up to this size; larger models skip the check rather than stall set-up.
MAX_CHECK_PARAMS = 2_000_000_000
# Allowed |split - whole| per unit of the output's largest magnitude: TP reassociates the
# sums over the split features (fp32: ~1e-6 relative; bf16: ~1e-2), a wrong split is O(1).
RELATIVE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 5e-2,
                      torch.float16: 1e-2}
ABSOLUTE_TOLERANCE = 1e-6  # outputs that are ~0 everywhere (a zero-initialised projection)
RELAYOUT_FEATURES = 2  # hidden size of the random activation a re-layout is checked on
RELAYOUT_SEED = 0  # every rank draws the same global activation and gradient


@dataclass
class _Record:
    args: tuple
    kwargs: dict
    output: torch.Tensor | None = None
    fused: dict[str, torch.Tensor] | None = None  # fused parameter (in the layer) -> whole


def _fused_weights(layer_module: nn.Module, layer) -> dict[str, torch.Tensor]:
    """The layer's fused per-part parameters, whole and in the model's order (a copy)."""
    out = {}
    for cand in layer.tp_candidates:
        if cand.fused:
            for name, param in layer_module.get_submodule(cand.module).named_parameters(
                    recurse=False):
                out[f"{cand.module}.{name}"] = param.detach().clone()
    return out


def _fused_round_trip(layer_module: nn.Module, whole: dict[str, torch.Tensor]) -> tuple[float, str]:
    """(largest difference, which parameter) between the split fused parameters gathered
    back in the model's order and their unsplit records (collective over the TP mesh)."""
    worst, where = 0.0, ""
    for path, expected in whole.items():
        module_path, name = path.rsplit(".", 1)
        sub = layer_module.get_submodule(module_path)
        split = getattr(sub, FUSED_ATTR, None)
        dim = dict(split.dims).get(name) if split is not None else None
        if dim is None:
            return float("inf"), path
        got = full_in_model_order(getattr(sub, name), split, dim)
        diff = (got.double() - expected.to(got.device).double()).abs().max().item() \
            if got.shape == expected.shape else float("inf")
        if diff > worst:
            worst, where = diff, path
    return worst, where


def _detached(tree: Any) -> Any:
    return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def _main_tensor(output: Any) -> torch.Tensor | None:
    leaves, _ = tree_flatten(output)
    return next((t for t in leaves if isinstance(t, torch.Tensor)), None)


def _first_rows(inputs: dict, rows: int) -> dict:
    sizes = {v.shape[0] for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim()}
    batch = max(sizes) if sizes else 0
    return {k: v[:rows] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == batch
            else v for k, v in inputs.items()}


def _checked_layers(plan: ParallelPlan, graph: LayerGraph) -> list[int]:
    return [j for j, (layer, s) in enumerate(zip(graph.layers, plan.layer_strategies))
            if s.tp > 1 and layer.tp_candidates]


class TPSelfCheck:
    """Recorded unsharded layer runs, checked per stage module after `apply_tp`."""

    def __init__(self, records: dict[int, _Record], stages: int, seconds: float,
                 skipped: str | None):
        self.records = records
        self.pending_stages = stages  # stage modules of this rank still to check
        self.seconds = seconds
        self.skipped = skipped  # why no check runs, or None
        self.worst = 0.0
        self.failures: dict[int, str] = {}  # layer -> why its split run raised, this rank
        self.enabled = True

    @classmethod
    def record(cls, model: nn.Module, plan: ParallelPlan, graph: LayerGraph,
               example_inputs: dict | None, stages: int, enabled: bool = True) -> "TPSelfCheck":
        """Run the whole, unsplit `model` once and keep each TP layer's inputs and output."""
        check = cls._record(model, plan, graph, example_inputs, stages, enabled)
        check.enabled = enabled
        return check

    @classmethod
    def _record(cls, model: nn.Module, plan: ParallelPlan, graph: LayerGraph,
                example_inputs: dict | None, stages: int, enabled: bool) -> "TPSelfCheck":
        layers = _checked_layers(plan, graph)
        if not enabled or not layers:
            return cls({}, stages, 0.0, "off" if layers else None)
        params = sum(p.numel() for p in model.parameters())
        if example_inputs is None:
            return cls({}, stages, 0.0, "apply() got no example_inputs to run the layers on")
        if any(p.is_meta for p in model.parameters()):
            return cls({}, stages, 0.0, "the model is on the meta device")
        if params > MAX_CHECK_PARAMS:
            return cls({}, stages, 0.0, f"{params:,} parameters > MAX_CHECK_PARAMS")
        start = time.perf_counter()
        records: dict[int, _Record] = {}
        fused: dict[int, dict[str, torch.Tensor]] = {}
        handles = []
        for j in layers:
            module = model.get_submodule(graph.layers[j].name)

            def pre(_m, args, kwargs, j=j):
                if j not in records:
                    records[j] = _Record(_detached(args), _detached(kwargs))

            def post(_m, _args, _kwargs, output, j=j):
                if records[j].output is None:
                    records[j].output = _detached(_main_tensor(output))

            fused[j] = _fused_weights(module, graph.layers[j])
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(module.register_forward_hook(post, with_kwargs=True))
        device = next(model.parameters()).device
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                  for k, v in _first_rows(example_inputs, CHECK_ROWS).items()}
        modes = {m: m.training for m in model.modules()}
        try:
            model.eval()  # no dropout: the split run must see the same function
            with torch.no_grad():
                model(**inputs)
        finally:
            for h in handles:
                h.remove()
            for m, mode in modes.items():
                m.training = mode
        for j, rec in records.items():
            rec.fused = fused[j]
        return cls(records, stages, time.perf_counter() - start, None)

    def _difference(self, module: nn.Module, j: int, plan: ParallelPlan, graph: LayerGraph,
                    meshes: Meshes) -> tuple[float, float]:
        """(largest |split - whole|, allowed) for layer j, run split on its recorded inputs."""
        layer, s = graph.layers[j], plan.layer_strategies[j]
        rec = self.records[j]
        args, kwargs = _detached(rec.args), _detached(rec.kwargs)
        sp = sequence_parallel_applies(layer, s)
        group = meshes.tp_group(s.tp)
        if sp:
            rank = dist.get_rank(group)
            args, kwargs = map_main_input(
                args, kwargs, lambda x: x.chunk(s.tp, dim=SEQ_DIM)[rank].contiguous())
        modes = {m: m.training for m in module.modules()}
        try:
            module.eval()
            with torch.no_grad():
                out = _main_tensor(module(*args, **kwargs))
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            # the same code fails alike on every rank of the group: report, do not crash
            self.failures[j] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return float("inf"), 0.0
        finally:
            for m, mode in modes.items():
                m.training = mode
        if isinstance(out, DTensor):
            out = out.full_tensor()
        if sp:
            parts = [torch.empty_like(out) for _ in range(s.tp)]
            dist.all_gather(parts, out.contiguous(), group=group)
            out = torch.cat(parts, dim=SEQ_DIM)
        ref = rec.output
        if out is None or ref is None or out.shape != ref.shape:
            return float("inf"), 0.0
        tol = RELATIVE_TOLERANCE.get(ref.dtype, RELATIVE_TOLERANCE[torch.float32])
        allowed = tol * ref.abs().max().item() + ABSOLUTE_TOLERANCE
        return (out.double() - ref.double()).abs().max().item(), allowed

    def check(self, module: nn.Module, layers: list[int], plan: ParallelPlan,
              graph: LayerGraph, meshes: Meshes, layer_module) -> None:
        """Compare this stage module's split layers with their records; raise
        PlannerError (on every rank alike) naming the first layer that differs."""
        if self.skipped is not None or not _checked_layers(plan, graph):
            self._report(plan, graph)
            return
        start = time.perf_counter()
        n = len(graph.layers)
        # [difference, allowed, fused weights gathered back - unsplit] per layer
        found = torch.zeros(3, n, dtype=torch.float64)
        fused_where: dict[int, str] = {}
        for j in layers:
            if j in self.records:
                split_module = layer_module(module, graph.layers[j].name)
                # collectives first, in the same order on every rank of the TP group
                found[2, j], fused_where[j] = _fused_round_trip(split_module,
                                                                 self.records[j].fused or {})
                diff, allowed = self._difference(split_module, j, plan, graph, meshes)
                found[0, j], found[1, j] = diff, allowed
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        found = found.to(device)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        found = found.cpu()
        self.seconds += time.perf_counter() - start
        for j in range(n):
            diff, allowed = found[0, j].item(), found[1, j].item()
            if found[2, j].item() > 0:  # data movement only: exact
                raise PlannerError(
                    f"layer {graph.layers[j].name}: its fused {fused_where.get(j, 'projection')} "
                    f"gathers back off its unsplit weights by up to {found[2, j].item():.3g}; "
                    "state dicts and checkpoints would hold them in another order; run it "
                    "with tp=1")
            if diff == float("inf"):
                why = self.failures.get(j, "it fails on another rank")
                raise PlannerError(
                    f"layer {graph.layers[j].name}: its tensor-parallel run (tp="
                    f"{plan.layer_strategies[j].tp}) fails on the input the unsplit layer "
                    f"ran on ({why}); a module of it reshapes with global sizes; run it "
                    "with tp=1")
            if diff > allowed:
                raise PlannerError(
                    f"layer {graph.layers[j].name}: its tensor-parallel run (tp="
                    f"{plan.layer_strategies[j].tp}) differs from the unsplit layer by up to "
                    f"{diff:.3g} (allowed {allowed:.1g}) on the same input; a module of it "
                    "reshapes with global sizes or splits wrongly; run it with tp=1")
            self.worst = max(self.worst, diff if allowed else 0.0)
        self._report(plan, graph)

    def check_relayouts(self, relayouts: list[tuple[int, str, Layout, Layout]],
                        plan: ParallelPlan, graph: LayerGraph, meshes: Meshes) -> None:
        """`check_relayouts` of this stage module's re-layout hooks, unless turned off."""
        plan_layouts = [layer_layout(plan, graph, j) for j in range(len(graph.layers))]
        check_relayouts(relayouts, plan_layouts, graph, meshes,
                        torch.device(meshes.device_type), enabled=self.enabled)

    def _report(self, plan: ParallelPlan, graph: LayerGraph) -> None:
        self.pending_stages -= 1
        if self.pending_stages or not dist.is_initialized() or dist.get_rank() != 0:
            return
        count = len(_checked_layers(plan, graph))
        if self.skipped == "off" or count == 0:
            return
        if self.skipped is not None:
            print(f"tp self-check skipped: {self.skipped}", flush=True)
        else:
            print(f"tp self-check: {count} tensor-parallel layer(s) match their unsplit "
                  f"selves (largest difference {self.worst:.1e}) in {self.seconds:.2f} s",
                  flush=True)


# ----------------------------------------------------------------------------- re-layouts


def _piece(x: torch.Tensor, layout: Layout, local_index: int) -> torch.Tensor:
    """This rank's piece of a global activation laid out as `layout` (`executors.layout`)."""
    x = x.chunk(layout.dp, dim=BATCH_DIM)[local_index // layout.tp]
    if layout.seq_sharded:
        x = x.chunk(layout.tp, dim=SEQ_DIM)[local_index % layout.tp]
    return x.contiguous()


def relayout_difference(src: Layout, dst: Layout, meshes: Meshes,
                        device: torch.device) -> float:
    """Largest |got - expected| of one re-layout run forward and backward on a random
    global activation (rows and sequence divisible by every degree of the stage)."""
    devices = meshes.dims.stage_devices
    local_index = meshes.rank % devices
    generator = torch.Generator().manual_seed(RELAYOUT_SEED)
    shape = (devices, 2 * devices, RELAYOUT_FEATURES)  # (batch, seq, hidden)
    activation = torch.randn(shape, generator=generator).to(device)
    grad = torch.randn(shape, generator=generator).to(device)
    x = _piece(activation, src, local_index).requires_grad_(True)
    y = layouts.relayout(x, src, dst, meshes)
    expected = _piece(activation, dst, local_index)
    if y.shape != expected.shape:
        return float("inf")
    y.backward(_piece(grad, dst, local_index))
    expected_grad = _piece(grad, src, local_index)
    if x.grad is None or x.grad.shape != expected_grad.shape:
        return float("inf")
    return max((y.detach() - expected).abs().max().item(),
               (x.grad - expected_grad).abs().max().item())


def plan_has_relayouts(layouts_by_layer: list[Layout]) -> bool:
    """Whether any rank places a re-layout hook (the same answer on every rank): the
    data arrives as whole sequences and the loss takes whole sequences."""
    return (layouts_by_layer[0].seq_sharded or layouts_by_layer[-1].seq_sharded
            or any(a != b for a, b in zip(layouts_by_layer, layouts_by_layer[1:])))


def check_relayouts(relayouts: list[tuple[int, str, Layout, Layout]], plan_layouts: list[Layout],
                    graph: LayerGraph, meshes: Meshes, device: torch.device,
                    enabled: bool = True) -> None:
    """Run each of this stage module's re-layouts [(layer, "input"/"output", src, dst)]
    once against the unsplit activation; PlannerError (every rank alike) naming the first
    layer whose re-layout differs. Collective when the plan has re-layouts anywhere."""
    if not enabled or not plan_has_relayouts(plan_layouts):
        return
    found = torch.zeros(len(graph.layers), 2, dtype=torch.float64)  # [input, output]
    errors: dict[tuple[int, int], str] = {}
    for j, side, src, dst in relayouts:
        column = 0 if side == "input" else 1
        try:
            found[j, column] = relayout_difference(src, dst, meshes, device)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            errors[j, column] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            found[j, column] = float("inf")
    found = found.to(device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    found = found.cpu()
    for j in range(len(graph.layers)):
        for column, side in enumerate(("input", "output")):
            diff = found[j, column].item()
            if diff == 0.0:
                continue
            if side == "input":  # (another stage's re-layouts are known from the plan too)
                src = plan_layouts[j - 1] if j else plan_layouts[0].full_sequence
                dst = plan_layouts[j]
            else:
                src, dst = plan_layouts[j], plan_layouts[j].full_sequence
            why = errors.get((j, column))
            what = (f"fails ({why})" if why else "fails on another rank") if diff == float("inf") \
                else f"differs from the unsplit activation by up to {diff:.3g}"
            raise PlannerError(
                f"layer {graph.layers[j].name}: its {side} re-layout {src} -> {dst} {what} on "
                "a random input (forward or backward); give it the TP degree and sequence "
                "parallelism of its neighbour")
