"""Pipeline parallelism: cut any model the layer IR can cut into stage modules, and run a
pipelining schedule over them.

A stage module is the WHOLE model in which every layer module outside the stage
(`graph.layers[j].name`) is replaced by a parameter-free `StandIn`, and the model's own
forward runs. Glue (masks, rotary tables, position ids, buffers, parameter-free modules)
therefore runs on every stage from the real model inputs, so Hugging Face and plain
user forwards work unchanged; nothing assumes a torchtitan-style model. On a stage that
starts at layer f:

  - the stand-in of layer f - 1 returns the activation received from the previous
    stage in place of that layer's main output (its first tensor leaf); stand-ins of
    earlier layers return zeros (`torch.zeros(()).expand(shape)`: no memory) of the
    real layer's output structure (a pytree, e.g. T5Block's (hidden, position_bias));
  - the stage's last layer raises `StageOutput` carrying its main output (a
    BaseException, so a model's `except Exception` cannot swallow it) and the stage
    forward returns that tensor; the last stage runs the model to the end and returns
    `ir.trace.model_output_tensor(output)` (the logits, for the loss).

Every stage takes the model inputs as keyword arguments (pipelining hands `kwargs` to
every stage and splits tensors along dim 0 into micro-batches; a tensor without the
batch along dim 0 travels wrapped in `Unsplit`, whole); later stages also take the
received activation positionally. Parameter names stay the full model's, so FSDP, TP,
activation checkpointing, checkpoints and tied-weight sync (`executors.tied`) see the
same names as without a pipeline. A rank holding several stages (interleaved 1F1B:
stages r, r + pp, ...) gets a deep copy per stage.

The output structures come from `StageAnalysis`: one forward of the unsharded model
under `FakeTensorMode` (no compute, no memory) with forward hooks, at the micro-batch
each rank sees, in ANALYSIS_DTYPE. The same analysis runs every stage under fake
tensors with its stand-ins and rejects, before any step and with the same verdict on
every rank, a layer called more than once per forward and a stage that reads a zeroed
output (something other than the main output of layer f - 1 crosses its cut).

Each stage module is wrapped in a `torch.distributed.pipelining.PipelineStage` on the
pipeline process group, and the plan's schedule runs `num_microbatches` micro-batches:

    gpipe        ScheduleGPipe            all forwards, then all backwards
    1f1b         Schedule1F1B             one forward, one backward (needs micro-batches >= stages)
    interleaved  ScheduleInterleaved1F1B  1F1B over virtual stages (Narayanan et al. 2021)

The loss runs on the last stage, already weighted by its micro-batch's share of the
global batch's counted targets (`executors.runtime`), so `scale_grads=False`.
"""

from __future__ import annotations

import copy
import weakref
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)
from torch.utils._pytree import tree_flatten, tree_unflatten

from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.plan import ParallelPlan
from ir.strategy import Schedule
from ir.trace import meta_copy, model_output_tensor

# Fake runs use bf16: the meta kernel of aten._grouped_mm (Hugging Face MoE experts)
# accepts only bf16, and shapes do not depend on the dtype. Recorded floating leaves in
# this dtype are made in the received activation's dtype.
ANALYSIS_DTYPE = torch.bfloat16
# Keywords of `schedule.step` itself: a model input of that name would be taken by it.
SCHEDULE_KEYWORDS = frozenset({"target", "losses", "return_outputs", "loss_kwargs"})


def rank_stages(plan: ParallelPlan, pp_rank: int) -> list[int]:
    """Stage indices pipeline rank `pp_rank` holds, in order (r, r + pp, ...)."""
    return [s for s in range(len(plan.stages)) if s % plan.pp == pp_rank]


def stage_layers(plan: ParallelPlan, stage_index: int) -> list[int]:
    stage = plan.stages[stage_index]
    return list(range(stage.first_layer, stage.last_layer + 1))


# ----------------------------------------------------------------------------- values


class StageOutput(BaseException):
    """Raised by a non-last stage's last layer: the stage's output, ends the forward."""

    def __init__(self, tensor: torch.Tensor):
        super().__init__("pipeline stage output")
        self.tensor = tensor


@dataclass(frozen=True)
class Unsplit:
    """A model input passed whole to every micro-batch (no batch along dim 0)."""

    value: Any


@dataclass(frozen=True)
class LeafMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class OutputStructure:
    """A layer's output: its pytree spec, leaves (LeafMeta for tensors, else the value)
    and the index of its main (first tensor) leaf."""

    spec: Any
    leaves: tuple
    main: int | None


def _main_leaf(value) -> torch.Tensor | None:
    return next((x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)), None)


# Non-tensor output leaves a stand-in can return as recorded (plain values, not objects
# that could hold the fake run's tensors, like a Hugging Face cache).
PLAIN_LEAVES = (type(None), bool, int, float, str, torch.dtype, torch.device)


def _structure(name: str, value) -> OutputStructure:
    leaves, spec = tree_flatten(value)
    odd = next((x for x in leaves if not isinstance(x, (torch.Tensor, *PLAIN_LEAVES))), None)
    if odd is not None:
        raise PlannerError(f"layer {name} returns a {type(odd).__name__}, which other "
                           "pipeline stages cannot stand in for; use pp=1 for this model")
    metas = tuple(LeafMeta(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x
                  for x in leaves)
    main = next((i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)), None)
    return OutputStructure(spec, metas, main)


# ----------------------------------------------------------------------------- static checks


def cut_problem(graph: LayerGraph, plan: ParallelPlan) -> str | None:
    """Why the layer IR cannot be cut as the plan's stages say, or None (merged layers:
    `ir.legality.merged_layer_problem`, which `validate.check_plan` asks first)."""
    for layer in graph.layers:
        if not layer.name:
            return ("layer '' (root-level glue holding parameters): a pipeline stage stands "
                    "in for layer modules, not for the root; use pp=1 for this model")
    for stage in plan.stages[:-1]:
        if stage.last_layer not in graph.cut_points:
            return (f"a pipeline cannot cut after layer {graph.layers[stage.last_layer].name}: "
                    "other tensors cross there; cut at one of layers "
                    f"{list(graph.cut_points)}")
    return None


def schedule_problem(plan: ParallelPlan) -> str | None:
    """Why torch.distributed.pipelining cannot run this schedule, or None."""
    n, stages, pp = plan.num_microbatches, len(plan.stages), plan.pp
    if plan.schedule is Schedule.ONE_F_ONE_B and n < stages:
        return (f"1F1B needs num_microbatches >= stages, got {n} < {stages}; raise "
                "num_microbatches or use the gpipe schedule")
    if plan.schedule is Schedule.INTERLEAVED:
        rounds = max(1, n // pp)
        if n % rounds:
            return (f"interleaved 1F1B needs num_microbatches ({n}) to be a multiple of "
                    f"max(1, num_microbatches // pp) = {rounds}; use a multiple of pp={pp}")
    if plan.schedule is not Schedule.INTERLEAVED and stages != pp:
        return (f"{plan.schedule} runs one stage per pipeline rank, the plan has {stages} "
                f"for pp={pp}")
    return None


# ----------------------------------------------------------------------------- stage modules


class _StageContext:
    """What one stage module's stand-ins read during its forward (plain data)."""

    def __init__(self, stage_index: int, names: list[str], first: int, last: int,
                 is_last: bool, model_forward: Callable, analysis: "StageAnalysis | None"):
        self.stage_index, self.names = stage_index, names
        self.first, self.last, self.is_last = first, last, is_last
        self.model_forward = model_forward  # the model class's own forward
        self.analysis = analysis  # None inside the analysis' own fake runs
        self.structures: dict[str, OutputStructure] = {}
        self.received: torch.Tensor | None = None
        self.zero_leaves: list[tuple[str, torch.Tensor]] | None = None  # analysis: to check


class StandIn(nn.Module):
    """A parameter-free stand-in for layer `layer_name` of another stage."""

    def __init__(self, layer_name: str, layer_index: int, context: _StageContext,
                 original: nn.Module):
        super().__init__()
        self.layer_name, self.layer_index = layer_name, layer_index
        # not submodules: no parameters; the meta original answers attribute reads
        # (e.g. a decoder layer's `attention_type`, read by Hugging Face glue)
        object.__setattr__(self, "_context", context)
        object.__setattr__(self, "_original", original)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_original")
            if original is None:
                raise
            return getattr(original, name)

    def extra_repr(self) -> str:
        return f"stands in for {self.layer_name}"

    def forward(self, *args, **kwargs):
        ctx = self._context
        if self.layer_index > ctx.last:
            raise PlannerError(f"layer {self.layer_name} runs before layer "
                               f"{ctx.names[ctx.last]} that ends pipeline stage "
                               f"{ctx.stage_index}: the model calls its layers out of the "
                               "layer IR's order; use pp=1 for this model")
        structure = ctx.structures[self.layer_name]
        device = ctx.received.device
        leaves = []
        for i, meta in enumerate(structure.leaves):
            if not isinstance(meta, LeafMeta):
                leaves.append(meta)
                continue
            dtype = meta.dtype
            if dtype == ANALYSIS_DTYPE and ctx.received.dtype.is_floating_point:
                dtype = ctx.received.dtype
            want_grad = ctx.zero_leaves is not None and dtype.is_floating_point
            base = torch.zeros((), dtype=dtype, device=device, requires_grad=want_grad)
            if want_grad and not (self.layer_index == ctx.first - 1 and i == structure.main):
                ctx.zero_leaves.append((self.layer_name, base))
            leaves.append(base.expand(meta.shape))
        if self.layer_index == ctx.first - 1:
            leaves[structure.main] = ctx.received
        return tree_unflatten(leaves, structure.spec)


def _stage_forward(self: nn.Module, *received, **inputs):
    """The stage module's forward: the model's own forward with the stand-ins in place."""
    ctx: _StageContext = self._pipeline_context
    inputs = {k: v.value if isinstance(v, Unsplit) else v for k, v in inputs.items()}
    if ctx.analysis is not None:
        ctx.structures = ctx.analysis.prepare(inputs)
    if ctx.first > 0 and len(received) != 1:
        raise PlannerError(f"pipeline stage {ctx.stage_index} expects one received tensor, "
                           f"got {len(received)}")
    ctx.received = _contiguous_gradient(received[0]) if received else None
    try:
        output = ctx.model_forward(self, **inputs)
    except StageOutput as done:  # gloo sends only contiguous tensors (Whisper's is a transpose)
        return done.tensor.contiguous()
    finally:
        ctx.received = None
    if not ctx.is_last:
        raise PlannerError(f"pipeline stage {ctx.stage_index}: the forward returned without "
                           f"running layer {ctx.names[ctx.last]}; use pp=1 for this model")
    return model_output_tensor(output)


class _ContiguousGradient(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: the schedule sends the
    received tensor's gradient back over gloo, which sends only contiguous tensors (a
    stage that first transposes its input gets a transposed gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _contiguous_gradient(received: torch.Tensor) -> torch.Tensor:
    return _ContiguousGradient.apply(received) if received.requires_grad else received


def _raise_stage_output(module: nn.Module, args, output) -> None:
    raise StageOutput(_main_leaf(output))


def build_stage_module(model: nn.Module, graph: LayerGraph, plan: ParallelPlan,
                       stage_index: int, *, make_copy: bool,
                       analysis: "StageAnalysis | None") -> nn.Module:
    """`model` (or a deep copy) with every layer outside stage `stage_index` stood in for,
    and its forward replaced (on the instance) by the stage forward."""
    module = copy.deepcopy(model) if make_copy else model
    stage = plan.stages[stage_index]
    names = [layer.name for layer in graph.layers]
    ctx = _StageContext(stage_index, names, stage.first_layer, stage.last_layer,
                        stage_index == len(plan.stages) - 1, type(module).forward, analysis)
    for j, name in enumerate(names):
        if stage.first_layer <= j <= stage.last_layer:
            continue
        parent_path, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        original = parent.get_submodule(attr)
        setattr(parent, attr, StandIn(name, j, ctx, meta_copy(original)))
    _drop_foreign_parameters(module, [names[j] for j in stage_layers(plan, stage_index)])
    object.__setattr__(module, "_pipeline_context", ctx)
    module.forward = types.MethodType(_stage_forward, module)
    return module


def _drop_foreign_parameters(module: nn.Module, kept_layers: list[str]) -> None:
    """Unregister parameters outside the stage's layers that are not theirs either: a
    tied alias outside every layer (T5's `shared`) of a layer on another stage."""
    kept = {id(p) for name in kept_layers for p in module.get_submodule(name).parameters()}
    for sub in module.modules():
        for pname, param in list(sub._parameters.items()):
            if param is not None and id(param) not in kept:
                sub.register_parameter(pname, None)


def finish_stage_module(module: nn.Module) -> None:
    """End the forward of a non-last stage at its last layer. Registered after every
    other hook of that layer (FSDP's post-forward, re-layouts) so that they all run."""
    ctx: _StageContext = module._pipeline_context
    if not ctx.is_last:
        module.get_submodule(ctx.names[ctx.last]).register_forward_hook(_raise_stage_output)


# ----------------------------------------------------------------------------- analysis


def _signature(inputs: dict) -> tuple:
    return tuple(sorted((k, (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else repr(v))
                        for k, v in inputs.items()))


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


class StageAnalysis:
    """Per input shape: every layer's output structure, and every stage checked under
    fake tensors (see the module docstring). The same verdict on every rank.

    A stage's check reads only its layer range and the layers' names: one analysis serves
    several plans of one model, graphs of any dtype too (`check_plan(analysis=)`);
    a range that passed for an input shape is not run again, a failing one always is."""

    def __init__(self, model: nn.Module, graph: LayerGraph, plan: ParallelPlan | None = None):
        # a weak reference: the analysis lives as long as the run, and the model it was
        # made from must not (its other stages' parameters would stay allocated)
        self.source = weakref.ref(model)
        self.graph, self.plan = graph, plan
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.model_name = type(model).__name__
        memo: dict[int, Any] = {}
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) in memo:
                continue
            dtype = ANALYSIS_DTYPE if t.dtype.is_floating_point else t.dtype
            with self.mode:
                fake = torch.empty(t.shape, dtype=dtype, device=t.device)
            is_param = isinstance(t, nn.Parameter)
            memo[id(t)] = nn.Parameter(fake, t.requires_grad) if is_param else fake
        self._tensors = dict(memo)
        self.model = copy.deepcopy(model, memo)  # fake parameters: no data copied
        self._done: dict[tuple, dict[str, OutputStructure]] = {}  # input signature -> records
        self._passed: set[tuple] = set()  # (input signature, first layer, last layer)

    def _fake(self, value):
        if not isinstance(value, torch.Tensor):
            return value
        # float inputs (pixel values, audio features) meet ANALYSIS_DTYPE weights
        dtype = ANALYSIS_DTYPE if value.is_floating_point() else value.dtype
        with self.mode:
            return torch.empty(value.shape, dtype=dtype, device=value.device)

    def prepare(self, inputs: dict, plan: ParallelPlan | None = None) -> dict[str, OutputStructure]:
        """Output structures for one micro-batch of `inputs`; rejects (PlannerError) a
        model or plan (default: the analysis's own) the stage modules cannot run."""
        plan = plan or self.plan
        key = _signature(inputs)
        fake_inputs = None
        if key not in self._done:
            fake_inputs = {k: self._fake(v) for k, v in inputs.items()}
            self._done[key] = self._record(fake_inputs)
        for s, stage in enumerate(plan.stages):
            cut = (key, stage.first_layer, stage.last_layer)
            if cut not in self._passed:
                fake_inputs = fake_inputs or {k: self._fake(v) for k, v in inputs.items()}
                self._check_stage(plan, s, fake_inputs, self._done[key])
                self._passed.add(cut)
        return self._done[key]

    def _record(self, inputs: dict) -> dict[str, OutputStructure]:
        seen: dict[str, list[OutputStructure]] = {}

        def hook(name, module, args, output):
            seen.setdefault(name, []).append(_structure(name, output))

        handles = [self.model.get_submodule(layer.name).register_forward_hook(
            lambda m, a, o, name=layer.name: hook(name, m, a, o)) for layer in self.graph.layers]
        try:
            with self.mode, torch.no_grad():
                self.model(**inputs)
        except PlannerError:
            raise
        except Exception as exc:
            raise PlannerError(f"a pipeline records each layer's output under fake tensors, "
                               f"and {self.model_name} cannot run there ({_one_line(exc)}); "
                               "use pp=1 for this model") from exc
        finally:
            for handle in handles:
                handle.remove()
        for layer in self.graph.layers:
            calls = len(seen.get(layer.name, []))
            if calls != 1:
                raise PlannerError(f"layer {layer.name} runs {calls} times in one forward; "
                                   "other pipeline stages stand in for a layer module called "
                                   "exactly once; use pp=1 for this model")
        return {name: calls[0] for name, calls in seen.items()}

    def _check_stage(self, plan: ParallelPlan, s: int, inputs: dict, structures: dict) -> None:
        shared = {id(t): t for t in self._tensors.values()}
        model = copy.deepcopy(self.model, shared)  # new modules, the same fake tensors
        module = build_stage_module(model, self.graph, plan, s, make_copy=False,
                                    analysis=None)
        finish_stage_module(module)
        ctx: _StageContext = module._pipeline_context
        ctx.structures, ctx.zero_leaves = structures, []
        names, where = ctx.names, f"pipeline stage {s} (layers {ctx.names[ctx.first]}.." \
                                  f"{ctx.names[ctx.last]})"
        received = ()
        if ctx.first > 0:
            boundary = structures[names[ctx.first - 1]]
            if boundary.main is None:
                raise PlannerError(f"layer {names[ctx.first - 1]} returns no tensor, so "
                                   f"{where} has nothing to receive; cut elsewhere")
            meta = boundary.leaves[boundary.main]
            with self.mode:
                received = (torch.empty(meta.shape, dtype=meta.dtype,
                                        device=_device(self._tensors)).requires_grad_(),)
        with self.mode, torch.enable_grad():
            try:
                out = module(*received, **inputs)
            except PlannerError:
                raise
            except Exception as exc:
                raise PlannerError(f"{where} cannot run with the other stages' layers stood "
                                   f"in for ({_one_line(exc)}); use pp=1 for this model") from exc
            if not isinstance(out, torch.Tensor):
                raise PlannerError(f"{where} returns {type(out).__name__}, not a tensor")
            leaves = [t for _, t in ctx.zero_leaves] + list(received)
            if not leaves or not out.requires_grad:
                return
            grads = torch.autograd.grad(out, leaves, torch.ones_like(out), allow_unused=True)
        for (name, _), grad in zip(ctx.zero_leaves, grads):
            if grad is not None:
                raise PlannerError(f"{where} uses an output of layer {name} other than what "
                                   f"crosses its cut (the main output of "
                                   f"{names[ctx.first - 1]}); cut elsewhere")
        if received and grads[-1] is None:
            raise PlannerError(f"{where} does not use the main output of layer "
                               f"{names[ctx.first - 1]}, the tensor crossing its cut; cut "
                               "elsewhere")


def _device(tensors: dict) -> torch.device:
    return next(iter(tensors.values())).device if tensors else torch.device("cpu")


# ----------------------------------------------------------------------------- runtime


def stage_inputs(inputs: dict, local_rows: int) -> dict:
    """The model inputs as schedule keywords: batch tensors (dim 0 = `local_rows`) are
    split into micro-batches by the schedule, everything else goes whole (`Unsplit`)."""
    clash = SCHEDULE_KEYWORDS & set(inputs)
    if clash:
        raise PlannerError(f"model input {sorted(clash)[0]!r} has the name of a keyword of "
                           "the pipelining schedule's step(); rename it or use pp=1")
    return {k: v if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == local_rows
            else Unsplit(v) for k, v in inputs.items()}


def build_schedule(plan: ParallelPlan, stage_modules: list[tuple[int, nn.Module]],
                   device: torch.device, group, loss_fn: Callable):
    """PipelineStage per (stage index, module) of this rank, and the plan's schedule."""
    for _, module in stage_modules:
        finish_stage_module(module)
    stages = [PipelineStage(module, index, len(plan.stages), device, group=group)
              for index, module in stage_modules]
    n = plan.num_microbatches
    if plan.schedule is Schedule.GPIPE:
        return ScheduleGPipe(stages[0], n, loss_fn=loss_fn, scale_grads=False), stages
    if plan.schedule is Schedule.ONE_F_ONE_B:
        return Schedule1F1B(stages[0], n, loss_fn=loss_fn, scale_grads=False), stages
    return ScheduleInterleaved1F1B(stages, n, loss_fn=loss_fn, scale_grads=False), stages
