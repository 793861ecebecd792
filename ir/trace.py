"""Trace a model (plus its loss) to one torch.fx graph, on the meta device.

    >>> traced = trace(model, {"input_ids": ids}, target=labels, loss_fn=F.cross_entropy)
    >>> traced.method            # "fx" or "export"
    >>> traced.graph_module.graph

`torch.fx.symbolic_trace` is tried first; where it fails (Hugging Face transformers 5
models: `co_varnames is too small`, Proxy item assignment) `torch.export.export(...,
strict=False)` is used. Both record `nn_module_stack` on nodes, which `ir.layers` uses
to group nodes into layers. Tracing never touches parameter data: meta models trace for
free, and real models are only read for shapes.

The loss is part of the graph (so the head's logits and loss are measured like any other
activation): for fx the loss call is appended to the traced graph; for export a wrapper
module computes it.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
from torch import nn

from ir.errors import PlannerError

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
LOSS_MODULE = "loss__"  # the loss's submodule in an fx graph module
TARGET_INPUT = "target__"  # the placeholder of the loss target


class _LossModule(nn.Module):
    def __init__(self, loss_fn: LossFn):
        super().__init__()
        self.loss_fn = loss_fn

    def forward(self, output, target):
        return self.loss_fn(output, target)


@dataclass(frozen=True)
class Traced:
    """A traced model. `state_names` maps export's lifted placeholders to FQNs."""

    graph_module: fx.GraphModule
    method: str  # "fx" or "export"
    root: nn.Module  # the module whose parameters the graph reads
    input_names: tuple[str, ...]  # user-input placeholders, in order
    module_prefix: str = ""  # prefix of nn_module_stack paths ("model." under export's wrapper)
    state_names: dict[str, str] = field(default_factory=dict)  # placeholder -> param/buffer FQN
    fx_error: str | None = None  # why fx failed, when export was used

    def submodule(self, target: str) -> nn.Module:
        """The module a call_module/get_attr target names (the loss module included)."""
        if self.method == "fx":
            return self.graph_module.get_submodule(target) if target else self.graph_module
        return self.root.get_submodule(target) if target else self.root


def model_output_tensor(output: Any) -> Any:
    """Logits out of whatever a model returns (a tensor, a HF ModelOutput, a tuple)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is not None:
        return logits
    if isinstance(output, (tuple, list)) and output:
        return output[0]
    return output


class WithLoss(nn.Module):
    """`model(**inputs)` followed by `loss_fn(output, target)`: the unit that is traced."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...], loss_fn: LossFn | None):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.loss_fn = loss_fn

    def forward(self, *args):
        inputs = dict(zip(self.input_names, args))
        out = model_output_tensor(self.model(**inputs))
        if self.loss_fn is None:
            return out
        return self.loss_fn(out, args[len(self.input_names)])


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:300]


def _trace_fx(model: nn.Module, inputs: dict[str, torch.Tensor], has_target: bool,
              loss_fn: LossFn | None) -> fx.GraphModule:
    gm = fx.symbolic_trace(model, concrete_args=None)
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    names = [n.target for n in placeholders]
    missing = [k for k in inputs if k not in names]
    if missing:
        raise TypeError(f"forward() has no parameter named {missing[0]!r}")
    # Placeholders the caller does not feed must have defaults (fx keeps them as inputs).
    for n in placeholders:
        if n.target not in inputs and not n.args:
            raise TypeError(f"input {n.target!r} of forward() has no value and no default")
    (output_node,) = [n for n in graph.nodes if n.op == "output"]
    out_arg = output_node.args[0]
    if not isinstance(out_arg, fx.Node):
        raise TypeError("model output is not a single tensor; fx path needs one")
    if has_target and loss_fn is not None:
        # The loss is a submodule of the graph module so that any callable (a lambda
        # too) survives fx code generation.
        gm.add_submodule(LOSS_MODULE, _LossModule(loss_fn))
        # After inputs with defaults the target needs one too (Python's argument order).
        defaults = any(n.args for n in placeholders)
        with graph.inserting_after(placeholders[-1]):
            target_node = graph.placeholder(TARGET_INPUT, default_value=None) if defaults \
                else graph.placeholder(TARGET_INPUT)
        with graph.inserting_before(output_node):
            loss_node = graph.call_module(LOSS_MODULE, (out_arg, target_node))
        output_node.args = (loss_node,)
    graph.lint()
    gm.recompile()
    return gm


def meta_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of `model` on the meta device (floating state cast to `dtype`), made without
    copying any data: deepcopy's memo maps every parameter and buffer to its stand-in."""
    memo: dict[int, object] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in memo:
            continue
        to = dtype if (dtype is not None and t.dtype.is_floating_point) else t.dtype
        stand_in = torch.empty(t.shape, dtype=to, device="meta")
        if isinstance(t, nn.Parameter):
            stand_in = nn.Parameter(stand_in, requires_grad=t.requires_grad)
        memo[id(t)] = stand_in
    return copy.deepcopy(model, memo)


def _trace_export(model: nn.Module, inputs: dict[str, torch.Tensor], target, loss_fn, dtype):
    # Export specialises the graph on dtypes (asserts, casts back to the input dtype), so
    # it traces a meta copy already in the measurement dtype.
    model = meta_copy(model, dtype)
    inputs = {k: v.detach().to(device="meta", dtype=dtype if (dtype and v.is_floating_point())
                                else v.dtype) for k, v in inputs.items()}
    if target is not None:
        target = target.detach().to(device="meta")
    names = tuple(inputs)
    wrapper = WithLoss(model, names, loss_fn if target is not None else None)
    args = tuple(inputs.values()) + ((target,) if target is not None else ())
    # a failed export logs the whole graph; our error says enough
    with _quiet_logging(), _no_node_stack_traces():
        ep = torch.export.export(wrapper, args, strict=False)
    gm = ep.graph_module  # the ATen graph; parameters and buffers are lifted placeholders
    state_names: dict[str, str] = {}
    user_inputs: list[str] = []
    for spec in ep.graph_signature.input_specs:
        kind = spec.kind.name
        if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            # export names the wrapper's module "model"; strip it to get the user's FQNs
            state_names[spec.arg.name] = re.sub(r"^model\.", "", spec.target)
        elif kind == "USER_INPUT":
            user_inputs.append(spec.arg.name)
    constants = {}
    for fqn, value in ep.constants.items():
        constants[re.sub(r"^model\.", "", fqn)] = value
    gm.meta["export_constants"] = constants
    return gm, state_names, tuple(user_inputs), model


def trace(model: nn.Module, inputs: dict[str, torch.Tensor], target: torch.Tensor | None = None,
          loss_fn: LossFn | None = None, *, force: str | None = None,
          dtype: torch.dtype | None = None) -> Traced:
    """Trace `model(**inputs)` (then `loss_fn(output, target)`) into one graph.

    `force="fx"` or `"export"` skips the other method. `dtype` is the dtype the graph will
    be run in (export specialises on it; fx graphs are dtype-agnostic). Raises PlannerError (one line that
    names the failing module or op and what to do) when neither works.
    """
    if force not in (None, "fx", "export"):
        raise PlannerError(f"unknown trace method {force!r}; use 'fx' or 'export'")
    fx_error = None
    if force in (None, "fx"):
        try:
            gm = _trace_fx(model, inputs, target is not None, loss_fn)
            names = tuple(n.target for n in gm.graph.nodes if n.op == "placeholder")
            return Traced(gm, "fx", model, names)
        except Exception as exc:  # fx fails in many ways; export is the fallback
            fx_error = _one_line(exc)
            if force == "fx":
                raise PlannerError(f"torch.fx could not trace {type(model).__name__}: "
                                   f"{fx_error}") from exc
    try:
        gm, state_names, user_inputs, root = _trace_export(model, inputs, target, loss_fn, dtype)
    except Exception as exc:
        where = _failing_location(exc)
        raise PlannerError(
            f"cannot trace {type(model).__name__}: torch.fx failed ({fx_error}) and "
            f"torch.export failed{where} ({_one_line(exc)}); make forward() free of "
            "data-dependent Python control flow (no .item()/if on tensor values) or pass "
            "a traceable wrapper") from exc
    return Traced(gm, "export", root, user_inputs, "model.", state_names, fx_error)


@contextlib.contextmanager
def _quiet_logging():
    """Silence export's logging and its graph dump on stderr (it prints on failure)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def _no_node_stack_traces():
    """Trace without torch.fx's per-node Python stack (`Node.stack_trace`), which nothing
    here reads: fx extracts and symbolises it at every node it makes, 20-35% of a tiny
    Hugging Face model's export (opt 0.19 -> 0.12 s of thread CPU, qwen3 0.37 -> 0.29,
    min of 3, load 2.6, 2026-11-26). Our errors name the module from the exception's own
    traceback (`_failing_location`)."""
    import torch.fx.config as fx_config

    previous = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = previous


def _failing_location(exc: BaseException) -> str:
    """' in module X' / ' at op Y' from an export error's traceback, when it says."""
    tb = exc.__traceback__
    last_user_frame = None
    while tb is not None:
        frame = tb.tb_frame
        filename = frame.f_code.co_filename
        if "/torch/" not in filename and "/ir/trace.py" not in filename:
            self_obj = frame.f_locals.get("self")
            if isinstance(self_obj, nn.Module):
                last_user_frame = f" in {type(self_obj).__name__}.{frame.f_code.co_name}"
        tb = tb.tb_next
    return last_user_frame or ""
