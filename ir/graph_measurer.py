"""Measuring the layers of a traced graph, one forward + backward each.

    >>> measurer = GraphMeasurer(traced, inputs, target, torch.float32)
    >>> measurer.measure_layer(3, colwise, rowwise)   # LayerMeasurement(flops_fwd=..., ...)

`GraphMeasurer` groups the graph's nodes into layers (`ir.layers`), works out each
layer's boundary (values from outside, values used outside) and runs the whole graph
once on meta tensors for every node's value (shapes). `measure_layer` then runs one
layer on fresh stand-ins for its inputs (`ir.stand_in`), forward and backward, with
  - `FlopCounterMode` around forward and around backward,
  - `OpCounter` around each (`ir.op_count`), recording every op as a kernel
    (`ir.kernel_recorder`; SDPA and dropout as the fused kernels CUDA runs),
  - `saved_tensors_hooks` recording every tensor autograd keeps (`ir.saved_tensors`).
`layer_module` is the same layer as its own `fx.GraphModule` (generated Python calling
the leaf modules and functions directly, as the executor's modules run), for timing on a
device (`cost_models.layer_profile`); `start_run`, `run_forward` and `grad_roots` run it
node by node through an interpreter, as the instrumented measurement does.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import FlopCounterMode

from ir.dtensor_ops import DTensorRegions
from ir.kernel_recorder import FusedKernels, KernelRecorder
from ir.kernel_records import KernelRecords
from ir.layer import LayerMeasurement, TPStyle
from ir.layers import LayerNodes, group_nodes, node_module_path
from ir.op_count import OpCounter, autograd_nodes, python_nodes
from ir.saved_tensors import SavedTensorLog, TPRegion, storage_key, tensor_leaves
from ir.stand_in import (StateRunner, TensorFactory, fresh, is_data, is_float, make_state,
                         meta_factory)
from ir.tp_recompute import ReductionsBeforeLastSave
from ir.view_nodes import ViewCountingRecorder, view_nodes
from ir.trace import TARGET_INPUT, Traced


@dataclass
class _LayerInfo:
    nodes: LayerNodes
    inputs: list[fx.Node]  # values from outside the layer (placeholders included)
    outputs: list[fx.Node]  # values used outside the layer
    module_paths: dict[fx.Node, str | None]


class GraphMeasurer:
    """Holds a traced graph, its layer grouping and forward values; measures layers."""

    def __init__(self, traced: Traced, inputs: dict[str, torch.Tensor], target, dtype):
        self.traced = traced
        self.dtype = dtype
        self.layers = group_nodes(traced.graph_module, traced.root, traced.module_prefix)
        self.user_values = self._user_values(inputs, target, meta=True)
        self.state, self.aliases = make_state(traced, dtype, meta_factory)
        gm = traced.graph_module
        self.owner: dict[fx.Node, int] = {}
        for i, layer in enumerate(self.layers):
            for n in layer.nodes:
                self.owner[n] = i
        self.infos: list[_LayerInfo] = []
        for i, layer in enumerate(self.layers):
            members = set(layer.nodes)
            ins, outs = [], []
            for n in layer.nodes:
                for a in n.all_input_nodes:
                    if a not in members and a not in ins and not self._is_state(a):
                        ins.append(a)
                if any(u not in members for u in n.users):
                    outs.append(n)
            paths = {n: node_module_path(n, traced.module_prefix) for n in layer.nodes}
            self.infos.append(_LayerInfo(layer, ins, outs, paths))
        # Forward values (shapes) of every node: one pass over the whole graph, on meta,
        # autograd on as in a step, so a value requires grad where a step's does (made from
        # parameters, or inputs given requiring grad: `ir.stand_in.is_data`), then cut from
        # that graph keeping the flag (`_gradless`).
        runner = self._runner(self.state)
        runner.env = self._placeholder_env(self.state, self.user_values)
        with torch.enable_grad():
            for n in gm.graph.nodes:
                if n.op in ("placeholder", "output"):
                    continue
                runner.env[n] = runner.run_node(n)
        self.values: dict[fx.Node, object] = {n: _gradless(v) for n, v in runner.env.items()}

    # -- helpers
    def _is_state(self, node: fx.Node) -> bool:
        return node.op == "placeholder" and node.name in self.traced.state_names

    def target_placeholder(self) -> fx.Node | None:
        """The loss target's placeholder (user placeholders follow `user_values`' order)."""
        if TARGET_INPUT not in self.user_values:
            return None
        user = [n for n in self.traced.graph_module.graph.nodes
                if n.op == "placeholder" and not self._is_state(n)]
        return user[list(self.user_values).index(TARGET_INPUT)]

    def _user_values(self, inputs, target, meta: bool):
        values = {}
        for name, t in inputs.items():
            dtype = self.dtype if is_float(t.dtype) else t.dtype
            values[name] = t.detach().to(device="meta" if meta else t.device,
                                         dtype=dtype).requires_grad_(t.requires_grad)
        if target is not None:
            values[TARGET_INPUT] = target.detach().to(device="meta") if meta else target
        return values

    def _runner(self, state) -> StateRunner:
        return StateRunner(self.traced, state, self.aliases)

    def _placeholder_env(self, state, user_values) -> dict:
        env = {}
        placeholders = [n for n in self.traced.graph_module.graph.nodes if n.op == "placeholder"]
        user = [n for n in placeholders if not self._is_state(n)]
        names = list(user_values)
        for n in placeholders:
            if self._is_state(n):
                fqn = self.traced.state_names[n.name]
                fqn = self.aliases.get(fqn, fqn)
                if fqn in state:  # a partial state holds only one layer's tensors
                    env[n] = state[fqn]
        for i, n in enumerate(user):
            if self.traced.method == "fx":
                key = n.target
                if key in user_values:
                    env[n] = user_values[key]
                elif n.args:
                    env[n] = n.args[0]  # a defaulted forward() argument
            else:
                env[n] = user_values[names[i]]
        return env

    def state_params_used(self, index: int) -> list[str]:
        """Canonical FQNs of parameters the layer's nodes read, in first-use order."""
        return [n for n in self.state_used(index) if n in self.aliases]

    def state_used(self, index: int) -> list[str]:
        """FQNs of parameters (canonical) and buffers the layer's nodes read."""
        info = self.infos[index]
        root = self.traced.root
        names: list[str] = []
        for n in info.nodes.nodes:
            found: list[str] = []
            if n.op == "call_module":
                module = self.traced.submodule(n.target)
                prefix = f"{n.target}." if n.target else ""
                found = [prefix + k for k, _ in module.named_parameters(remove_duplicate=False)]
                found += [prefix + k for k, _ in module.named_buffers(remove_duplicate=False)]
            elif n.op == "get_attr":
                found = [str(n.target)]
            for a in n.all_input_nodes:
                if self._is_state(a):
                    found.append(self.traced.state_names[a.name])
            for f in found:
                c = self.aliases.get(f, f)
                if c not in names:
                    names.append(c)
        return names

    def structural_hash(self, index: int) -> str:
        info = self.infos[index]
        prefix = info.nodes.name + "."
        local = {n: i for i, n in enumerate(info.nodes.nodes)}
        ins = {n: i for i, n in enumerate(info.inputs)}

        def norm(a):
            if isinstance(a, fx.Node):
                if a in local:
                    return ("n", local[a])
                if a in ins:
                    return ("i", ins[a])
                if self._is_state(a):
                    t = self.values.get(a)
                    if t is None:
                        t = self.state.get(self.traced.state_names[a.name])
                    return ("s", tuple(getattr(t, "shape", ())))
                return ("?",)
            if isinstance(a, (tuple, list)):
                return tuple(norm(x) for x in a)
            if isinstance(a, dict):
                return tuple((k, norm(v)) for k, v in sorted(a.items()))
            if isinstance(a, slice):
                return ("slice", norm(a.start), norm(a.stop), norm(a.step))
            return repr(a)[:80]

        h = hashlib.sha256()
        for n in info.nodes.nodes:
            target = n.target
            if n.op in ("call_module", "get_attr"):
                t = str(target)
                t = t[len(prefix):] if t.startswith(prefix) else t
                if n.op == "call_module":
                    mod = self.traced.submodule(str(target))
                    shapes = tuple((k, tuple(p.shape), str(p.dtype)) for k, p in
                                   mod.named_parameters(remove_duplicate=False))
                    t = (t, type(mod).__name__, shapes)
                target = t
            else:
                target = getattr(target, "__qualname__", None) or str(target)
            h.update(repr((n.op, target, norm(n.args), norm(n.kwargs))).encode())
        for a in info.inputs:
            v = self.values.get(a, self.user_values.get(str(a.target)))
            # a float input from the model's data (no gradient) runs another backward
            h.update(repr([(tuple(t.shape), str(t.dtype)) + (("data",) if is_data(t) else ())
                           for t in tensor_leaves(v)]).encode())
        return h.hexdigest()[:16]

    def tp_modules(self, index: int, candidates) -> tuple[tuple[str, ...], tuple[str, ...]]:
        name = self.infos[index].nodes.name
        full = lambda m: f"{name}.{m}" if m else name  # noqa: E731
        col = tuple(full(c.module) for c in candidates if c.style is TPStyle.COLWISE)
        row = tuple(full(c.module) for c in candidates if c.style is TPStyle.ROWWISE)
        return col, row

    def layer_state(self, index: int, factory: TensorFactory = meta_factory) -> dict:
        """The state a run of layer `index` reads: the shared meta state, or only this
        layer's tensors made by `factory` (a model far larger than the device still runs
        layer by layer)."""
        if factory is meta_factory:
            return self.state
        state, _ = make_state(self.traced, self.dtype, factory, set(self.state_used(index)))
        return state

    def start_run(self, index: int, state: dict, factory: TensorFactory) -> StateRunner:
        """A runner whose env holds fresh stand-ins for layer `index`'s inputs."""
        runner = self._runner(state)
        runner.env = self._fresh_inputs(self.infos[index], state, factory)
        return runner

    def run_forward(self, index: int, runner: StateRunner,
                    before_node: Callable[[fx.Node], None] | None = None) -> None:
        device = _state_device(runner.state)
        for n in self.infos[index].nodes.nodes:
            if before_node is not None:
                before_node(n)
            if _makes_on_meta(n) and device.type != "meta":
                args, kwargs = runner.fetch_args_kwargs_from_env(n)
                runner.env[n] = getattr(runner, n.op)(n.target, args,
                                                      {**kwargs, "device": device})
            else:
                runner.env[n] = runner.run_node(n)

    def grad_roots(self, index: int, runner: StateRunner) -> list[torch.Tensor]:
        """Where backward starts: the layer's outputs that carry a gradient (the last
        layer's last value when nothing leaves it)."""
        return self._roots(index, runner.env)

    def _roots(self, index: int, values) -> list[torch.Tensor]:
        info = self.infos[index]
        outs = [t for o in info.outputs for t in tensor_leaves(values[o])
                if t.requires_grad and t.grad_fn is not None]
        if not outs and index == len(self.infos) - 1:
            outs = [t for t in tensor_leaves(values[info.nodes.nodes[-1]])
                    if t.requires_grad and t.grad_fn is not None]
        return outs

    def _returned_nodes(self, index: int) -> list[fx.Node]:
        """What `layer_module` returns: the layer's outputs, then its last node."""
        info = self.infos[index]
        last = info.nodes.nodes[-1]
        return list(info.outputs) + ([] if last in info.outputs else [last])

    def fresh_inputs(self, index: int, state: dict, factory: TensorFactory) -> list:
        """Fresh stand-ins for layer `index`'s inputs, in `layer_module`'s argument order."""
        env = self._fresh_inputs(self.infos[index], state, factory)
        return [env[a] for a in self.infos[index].inputs]

    def module_roots(self, index: int, returned: tuple) -> list[torch.Tensor]:
        """`grad_roots` of a `layer_module` call's return value."""
        return self._roots(index, dict(zip(self._returned_nodes(index), returned)))

    def layer_module(self, index: int, state: dict) -> fx.GraphModule:
        """Layer `index` as its own GraphModule: its nodes in order, codegen'd once, so a
        call runs generated Python that calls the leaf modules (copies holding `state`'s
        tensors as their parameters and buffers, tied ones shared) and the functions
        directly, as the executor's modules run; no interpreter and no `functional_call`
        between nodes, and one module call per layer call, as a step pays. Called with
        `fresh_inputs(index, ...)`, returns the values of the layer's outputs then its last
        node (`module_roots` picks backward's roots)."""
        info = self.infos[index]
        graph, root, env = fx.Graph(), {}, {}
        for a in info.inputs:
            env[a] = graph.placeholder(a.name)
        for n in info.nodes.nodes:
            for a in n.all_input_nodes:
                if a not in env and self._is_state(a):  # export's lifted params and buffers
                    env[a] = self._state_attr(graph, root, state,
                                              self.traced.state_names[a.name])
        for n in info.nodes.nodes:
            if n.op == "get_attr":
                env[n] = self._state_attr(graph, root, state, str(n.target))
                continue
            env[n] = graph.node_copy(n, lambda a: env[a])
            if _makes_on_meta(n):
                env[n].kwargs = {**n.kwargs, "device": _state_device(state)}
            if n.op == "call_module":
                env[n].target = f"module_{len(root)}"
                root[env[n].target] = self._module_on(str(n.target), state)
        graph.output(tuple(env[n] for n in self._returned_nodes(index)))
        module = fx.GraphModule(root, graph)
        # Called as a step calls the layer (the model's forward calls it as a module): one
        # `nn.Module.__call__`, not fx's error-reporting `_WrappedCall` around it (~0.5 us
        # more, thread clock, 2026-11-25); none where the graph holds the layer's own call
        # (a leaf layer: `embed`). The class is this instance's own (`GraphModule.__new__`).
        own_call = any(n.op == "call_module" and str(n.target) == info.nodes.name
                       for n in info.nodes.nodes)
        type(module).__call__ = type(module).forward if own_call else nn.Module.__call__
        return module

    def _state_attr(self, graph: fx.Graph, root: dict, state: dict, fqn: str) -> fx.Node:
        name = f"state_{len(root)}"
        canon = self.aliases.get(fqn, fqn)
        root[name] = state[fqn] if fqn in state else state[canon]
        return graph.get_attr(name)

    def _module_on(self, target: str, state: dict) -> nn.Module:
        """A copy of the module `target` names whose parameters ARE `state`'s tensors
        (as `StateRunner.call_module` binds them, once instead of per call)."""
        module = copy.deepcopy(self.traced.submodule(target))
        prefix = f"{target}." if target else ""
        for name, _ in list(module.named_parameters(remove_duplicate=False)):
            owner, _, leaf = name.rpartition(".")
            sub = module.get_submodule(owner)
            sub._parameters[leaf] = state[self.aliases.get(prefix + name, prefix + name)]
        for name, _ in list(module.named_buffers(remove_duplicate=False)):
            if prefix + name in state:
                owner, _, leaf = name.rpartition(".")
                module.get_submodule(owner)._buffers[leaf] = state[prefix + name]
        return module

    def measure_layer(self, index: int, colwise=(), rowwise=(),
                      factory: TensorFactory = meta_factory,
                      state: dict | None = None, replicated=(),
                      reducing=None) -> LayerMeasurement:
        """Forward + backward of one layer on fresh inputs, instrumented: FLOPs, saved
        bytes, op counts and random draws; the ops inside each module of `replicated`
        (full paths: `ir.dtensor_ops`); the calls of the modules that reduce their output
        (`reducing`, full paths; default `rowwise`) ending before the last save
        (`ir.tp_recompute`)."""
        info = self.infos[index]
        state = self.layer_state(index, factory) if state is None else state
        score_keys = {(self.values[n].numel(), self.values[n].shape[-1]) for n in info.nodes.nodes
                      if "softmax" in str(n.target).lower()
                      and isinstance(self.values.get(n), torch.Tensor) and self.values[n].dim()}
        dropout_nodes = {n for n in info.nodes.nodes if self._is_dropout(n)}
        param_keys = {storage_key(t) for t in state.values() if isinstance(t, torch.Tensor)}
        log = SavedTensorLog(param_keys, score_keys)
        # Two runs. The first logs what autograd keeps and counts FLOPs; both change what
        # is dispatched (saved-tensor hooks: a saved output no longer costs a detach in
        # forward, each other saved tensor one more in backward; FlopCounterMode's module
        # tracker a view per module call), so op counts and kernel records come from a
        # second forward + backward without them, as training runs.
        logged, log_region = self.start_run(index, state, factory), TPRegion(colwise, rowwise)
        fwd_flops, bwd_flops = FlopCounterMode(display=False), FlopCounterMode(display=False)
        reductions = ReductionsBeforeLastSave(rowwise if reducing is None else reducing)

        def log_tag(n: fx.Node) -> None:
            log.tp_sharded_now = log_region.enter(info.module_paths[n])
            log.in_dropout_now = n in dropout_nodes
            reductions.enter(info.module_paths[n])

        with torch.autograd.graph.saved_tensors_hooks(reductions.wrap(log.pack), log.unpack), \
                fwd_flops, log.ops, log.norms:
            self.run_forward(index, logged, before_node=log_tag)
        env = logged.env
        in_keys = {storage_key(t) for a in info.inputs for t in tensor_leaves(env.get(a))}
        out_keys = {storage_key(t) for o in info.outputs for t in tensor_leaves(env[o])}
        outs = self.grad_roots(index, logged)
        seeds, grads = [torch.ones_like(t) for t in outs], _clear_grads(state)
        with bwd_flops:
            if outs:
                torch.autograd.backward(outs, seeds)
        _restore_grads(state, grads)
        del logged, env, outs, seeds  # its graph, activations and gradients
        param_shapes = frozenset(tuple(t.shape) for t in state.values()
                                 if isinstance(t, torch.Tensor))
        fwd_kernels = ViewCountingRecorder(param_keys)
        bwd_kernels = KernelRecorder(param_keys, param_shapes)
        fwd_ops, bwd_ops = OpCounter(fwd_kernels), OpCounter(bwd_kernels)
        regions = DTensorRegions(replicated)
        fwd_ops.on_op, bwd_ops.on_op = partial(regions.count, False), partial(regions.count, True)
        fused = FusedKernels(fwd_kernels, bwd_kernels)
        runner, region = self.start_run(index, state, factory), TPRegion(colwise, rowwise)
        dispatched: dict[fx.Node, int] = {}  # node -> op count when it started
        viewed: dict[fx.Node, int] = {}  # node -> view count when it started

        def tag(n: fx.Node) -> None:
            dispatched[n], viewed[n] = fwd_ops.count, fwd_kernels.views
            fused.before_node(n, runner.env, dropout=n in dropout_nodes)
            fwd_ops.tp_sharded_now = region.enter(info.module_paths[n])
            regions.enter(info.module_paths[n])

        with fwd_ops:
            self.run_forward(index, runner, before_node=tag)
        regions.finish_forward(info.nodes.nodes, info.module_paths, runner.env, param_keys,
                               info.inputs)
        fused.finish(runner.env)
        outs = self.grad_roots(index, runner)
        nodes = autograd_nodes(outs, lambda t: storage_key(t) in param_keys)
        recorded = autograd_nodes(outs, lambda t: False)  # grad_fns the forward made
        seeds = [torch.ones_like(t) for t in outs]  # outside the count: training's loss
        grads = _clear_grads(state)                 # gradient flows in, no seed is made
        with bwd_ops:
            if outs:
                torch.autograd.backward(outs, seeds)
        _restore_grads(state, grads)
        return LayerMeasurement(
            flops_fwd=int(fwd_flops.get_total_flops()), flops_bwd=int(bwd_flops.get_total_flops()),
            saved_activation_bytes=log.total, saved_tp_sharded_bytes=log.sharded,
            saved_tensors_fwd=log.calls, saved_grad_tensors_fwd=log.grad_calls,
            ops_after_last_save_fwd=log.ops_after_last_save,
            saved_attention_bytes=log.scores, saved_dropout_mask_bytes=log.dropout_masks,
            saved_rms_norm_excess_bytes=log.rms_norm_excess,
            saved_rms_norm_tp_sharded_excess_bytes=log.rms_norm_sharded_excess,
            saved_input_bytes=sum(b for k, b in log.seen.items() if k in in_keys),
            saved_output_bytes=sum(b for k, b in log.seen.items() if k in out_keys),
            ops_fwd=fwd_ops.count, ops_bwd=bwd_ops.count, distinct_ops_fwd=fwd_ops.distinct_ops,
            forward_overloads=fwd_ops.overload_names, backward_overloads=bwd_ops.overload_names,
            python_nodes_fwd=python_nodes(info.nodes.nodes, dispatched, fwd_ops.count),
            python_view_nodes_fwd=view_nodes(info.nodes.nodes, dispatched, fwd_ops.count,
                                             viewed, fwd_kernels.views),
            autograd_nodes_bwd=nodes, autograd_nodes_fwd=recorded,
            random_elements_fwd=fwd_ops.random_elements,
            random_tp_sharded_elements_fwd=fwd_ops.random_tp_sharded_elements,
            kernels=KernelRecords(fwd_kernels.records(), bwd_kernels.records(),
                                  self.module_calls(index)),
            replicated_module_ops=regions.counts(info.nodes.name),
            rowwise_before_last_save_fwd=reductions.count)

    def module_calls(self, index: int) -> int:
        """Module calls layer `index`'s forward makes: its call_module nodes (fx keeps leaf
        modules as calls); in an export graph, which inlines every module, the distinct
        modules its ops ran in (`nn_module_stack`'s innermost entry)."""
        nodes = self.infos[index].nodes.nodes
        if self.traced.method == "fx":
            return sum(1 for n in nodes if n.op == "call_module")
        paths = {self.infos[index].module_paths[n] for n in nodes
                 if n.op == "call_function"}
        return len(paths - {None})

    def _is_dropout(self, node: fx.Node) -> bool:
        if node.op == "call_module":
            return isinstance(self.traced.submodule(str(node.target)), nn.modules.dropout._DropoutNd)
        return node.op in ("call_function", "call_method") and "dropout" in str(node.target).lower()

    def _fresh_inputs(self, info: _LayerInfo, state, factory) -> dict:
        env = self._placeholder_env(state, self.user_values)
        for a in info.inputs:
            if a.op == "placeholder" and a in env and factory is meta_factory:
                value = env[a]
            else:
                value = self.values.get(a, env.get(a))
            env[a] = fresh(value, factory)
        return env


def _gradless(value):
    """`value`'s tensors cut from the autograd graph, each keeping its requires_grad."""
    return tree_map_only(torch.Tensor, lambda t: t.detach().requires_grad_(t.requires_grad),
                         value)


def _clear_grads(state: dict) -> dict:
    """Takes the `.grad` of `state`'s tensors off (a tied weight's, from a layer measured
    before): each layer's backward is measured as a fresh step's, whose parameter
    gradients are stolen (one `detach` apiece) rather than added into (`add_`). Returns
    them for `_restore_grads`."""
    grads = {}
    for name, t in state.items():
        if isinstance(t, torch.Tensor) and t.grad is not None:
            grads[name], t.grad = t.grad, None
    return grads


def _restore_grads(state: dict, grads: dict) -> None:
    for name, t in state.items():
        if isinstance(t, torch.Tensor):
            t.grad = grads.get(name)


def _state_device(state: dict) -> torch.device:
    """The device a layer's state lives on (meta when it holds no tensor)."""
    return next((t.device for t in state.values() if isinstance(t, torch.Tensor)),
                torch.device("meta"))


def _makes_on_meta(node: fx.Node) -> bool:
    """A factory op (arange, zeros, full) that torch.export recorded with the meta device
    the model was traced on: a real run makes it on the state's device instead."""
    device = node.kwargs.get("device")  # a Node when the model reads `x.device`
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "meta"
