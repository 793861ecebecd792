"""Stand-in state: the tensors a layer runs on instead of the model's own.

Parameters are never read: each is replaced by a tensor of its shape in the measurement
dtype made by a `TensorFactory` (`meta_factory`: shape only, so a 175B-parameter model
measures in seconds on a laptop; `real_factory`: random values on a device, for
`planner profile`). `StateRunner` runs graph nodes against such a state by fully
qualified name (`torch.func.functional_call` for fx modules, placeholders for export
graphs); tied parameters resolve to one canonical name.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx
from torch import nn
from torch.func import functional_call

from ir.trace import Traced

TensorFactory = Callable[[torch.Size, torch.dtype, str], torch.Tensor]


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def meta_factory(shape, dtype, kind) -> torch.Tensor:
    """Shape-only tensors: measuring costs no memory."""
    return torch.empty(shape, dtype=dtype, device="meta")


def real_factory(device: str) -> TensorFactory:
    """Random tensors on a real device, for measured profiling."""

    def make(shape, dtype, kind):
        if is_float(dtype):
            return torch.randn(shape, dtype=dtype, device=device) * 0.02
        if dtype is torch.bool:
            return torch.ones(shape, dtype=dtype, device=device)
        return torch.zeros(shape, dtype=dtype, device=device)  # index 0 is valid everywhere

    return make


def canonical_param_names(root: nn.Module) -> dict[int, str]:
    """Parameter id -> its first (canonical) name: tied parameters share one."""
    return {id(p): name for name, p in root.named_parameters()}


def make_state(traced: Traced, dtype: torch.dtype, factory: TensorFactory,
               only: set[str] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """FQN -> stand-in tensor for every parameter and buffer (or those in `only`); and
    alias -> canonical FQN."""
    root = traced.root
    canon = canonical_param_names(root)
    aliases: dict[str, str] = {}
    state: dict[str, torch.Tensor] = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        aliases[name] = canon[id(p)]
        if canon[id(p)] == name and (only is None or name in only):
            t = factory(p.shape, dtype if is_float(p.dtype) else p.dtype, "param")
            state[name] = t.requires_grad_(is_float(t.dtype))
    for name, b in root.named_buffers():
        if only is not None and name not in only:
            continue
        bdtype = dtype if is_float(b.dtype) else b.dtype
        if b.device.type == "meta" or factory is not meta_factory:
            state[name] = factory(b.shape, bdtype, "buffer")
        else:
            state[name] = b.detach().to(device="meta", dtype=bdtype)
    for name, c in traced.graph_module.meta.get("export_constants", {}).items():
        if isinstance(c, torch.Tensor) and (only is None or name in only):
            state[name] = factory(c.shape, dtype if is_float(c.dtype) else c.dtype, "const")
    return state, aliases


def is_data(value: torch.Tensor) -> bool:
    """Whether a float value a layer reads is the model's data (images, dense features:
    made from the inputs alone), which a step runs without a gradient, rather than an
    activation. The one rule: the value, from the IR's meta pass with autograd on
    (`GraphMeasurer`), requires no grad (an input given requiring grad keeps it); so a
    later pipeline stage's input, made by layers holding parameters, is no data."""
    return is_float(value.dtype) and not value.requires_grad


class StepInput(torch.autograd.Function):
    """A layer's input as a step's middle layer receives it: an activation (a fresh
    leaf's storage) whose gradient goes on to a node of the layer before, here this one, which
    runs no op. A leaf input would end the layer's backward with an AccumulateGrad per
    input that no step runs: a `detach`, or where the gradient is not laid out as
    AccumulateGrad keeps it (dlrm-small's top_mlp, slices of a concatenation) a
    `new_empty_strided` + `copy_` (tests/test_step_inputs.py)."""

    @staticmethod
    def forward(ctx, leaf: torch.Tensor) -> torch.Tensor:
        # its storage, not a view (autograd forbids in-place writes to a custom Function's
        # view outputs; a layer may write its input in place, as it may an activation)
        return leaf.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> None:
        return None  # the layer before's work, not this layer's


def step_input(value: torch.Tensor) -> torch.Tensor:
    """`value` as a step's middle layer receives its input: requiring grad, through a
    `StepInput` (an activation, not a leaf: the layer's backward ends at the stand-in's
    node, which runs no op, not in an AccumulateGrad). Every stand-in and probe input
    that stands for a layer's is made here."""
    return StepInput.apply(value.requires_grad_(True))


def is_step_input(node) -> bool:
    """Whether an autograd node is a `StepInput`'s (where a layer's backward ends)."""
    return isinstance(node, StepInput._backward_cls)


def fresh(value, factory: TensorFactory):
    """A stand-in for a boundary value, cut from any graph; a float tensor requires grad
    unless it stands in for the model's data (`is_data`), as in a step, and then is a
    `StepInput`: an activation, not a leaf."""
    if isinstance(value, torch.Tensor):
        t = factory(value.shape, value.dtype, "input")
        if is_float(t.dtype) and not is_data(value):
            return step_input(t)
        return t
    if isinstance(value, tuple):
        return tuple(fresh(v, factory) for v in value)
    if isinstance(value, list):
        return [fresh(v, factory) for v in value]
    if isinstance(value, dict):
        return {k: fresh(v, factory) for k, v in value.items()}
    return value


class StateRunner(fx.Interpreter):
    """Runs single nodes against an explicit env, reading state from `state` by FQN."""

    def __init__(self, traced: Traced, state: dict[str, torch.Tensor], aliases: dict[str, str]):
        super().__init__(traced.graph_module, garbage_collect_values=False)
        self.traced = traced
        self.state = state
        self.aliases = aliases  # any parameter name -> its canonical (tied) name

    def call_module(self, target, args, kwargs):
        module = self.traced.submodule(target)
        prefix = f"{target}." if target else ""
        local = {}
        for name, _ in module.named_parameters(remove_duplicate=False):
            local[name] = self.state[self._canon(prefix + name)]
        for name, buf in module.named_buffers(remove_duplicate=False):
            local[name] = self.state.get(prefix + name, buf)
        return functional_call(module, local, args, kwargs, tie_weights=False, strict=False)

    def get_attr(self, target, args, kwargs):
        if target in self.state:
            return self.state[target]
        canon = self._canon(target)
        if canon in self.state:
            return self.state[canon]
        return super().get_attr(target, args, kwargs)

    def _canon(self, fqn: str) -> str:
        return self.aliases.get(fqn, fqn)
