"""Measure every layer of a traced graph and build the `LayerGraph`.

    >>> graph = build_layer_graph(model, {"input_ids": ids}, labels, loss_fn, name="gpt-tiny")

Each *unique* layer (by structural hash: same ops, same parameter and input shapes) is
run once, forward and backward, on the meta device (or on a real device, for
`planner profile`), with
  - `FlopCounterMode` around forward and around backward,
  - `saved_tensors_hooks` recording every tensor autograd keeps (deduplicated by
    storage, parameters excluded), each tagged TP-sharded or not and attention-score or
    not (see `_SavedTensorLog`).
Parameters are never read: each is replaced by a meta tensor of its shape in the
measurement dtype (`torch.func.functional_call` for fx modules, placeholders for export
graphs), so a 175B-parameter model measures in seconds on a laptop.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
from torch import nn
from torch.func import functional_call
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ir.layer import Layer, LayerGraph, TPStyle
from ir.layers import LayerNodes, group_nodes
from ir.ownership import names_in_layers
from ir.plan import layer_digest
from ir.trace import TARGET_INPUT, LossFn, Traced, trace
from ir.legality import sequence_parallel_problem, takes_one_positional_input
from ir.tp import largest_vocab, tp_analysis

TensorFactory = Callable[[torch.Size, torch.dtype, str], torch.Tensor]


# ----------------------------------------------------------------------------- state


def _canonical_param_names(root: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in root.named_parameters()}


def _float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def meta_factory(shape, dtype, kind) -> torch.Tensor:
    """Shape-only tensors: measuring costs no memory."""
    return torch.empty(shape, dtype=dtype, device="meta")


def real_factory(device: str) -> TensorFactory:
    """Random tensors on a real device, for measured profiling."""

    def make(shape, dtype, kind):
        if _float(dtype):
            return torch.randn(shape, dtype=dtype, device=device) * 0.02
        if dtype is torch.bool:
            return torch.ones(shape, dtype=dtype, device=device)
        return torch.zeros(shape, dtype=dtype, device=device)  # index 0 is valid everywhere

    return make


class _Runner(fx.Interpreter):
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


def _make_state(traced: Traced, dtype: torch.dtype, factory: TensorFactory,
                only: set[str] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """FQN -> stand-in tensor for every parameter and buffer (or those in `only`); and
    alias -> canonical FQN."""
    root = traced.root
    canon = _canonical_param_names(root)
    aliases: dict[str, str] = {}
    state: dict[str, torch.Tensor] = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        aliases[name] = canon[id(p)]
        if canon[id(p)] == name and (only is None or name in only):
            t = factory(p.shape, dtype if _float(p.dtype) else p.dtype, "param")
            state[name] = t.requires_grad_(_float(t.dtype))
    for name, b in root.named_buffers():
        if only is not None and name not in only:
            continue
        bdtype = dtype if _float(b.dtype) else b.dtype
        if b.device.type == "meta" or factory is not meta_factory:
            state[name] = factory(b.shape, bdtype, "buffer")
        else:
            state[name] = b.detach().to(device="meta", dtype=bdtype)
    for name, c in traced.graph_module.meta.get("export_constants", {}).items():
        if isinstance(c, torch.Tensor) and (only is None or name in only):
            state[name] = factory(c.shape, dtype if _float(c.dtype) else c.dtype, "const")
    return state, aliases


# ---------------------------------------------------------------------- saved tensors


def _storage_key(t: torch.Tensor):
    try:
        return StorageWeakRef(t.untyped_storage()).cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


class _SavedTensorLog:
    """Records tensors saved for backward while a layer's forward runs.

    A tensor is TP-sharded when it is saved between a column-parallel module's output and
    the end of the next row-parallel module (the row-parallel module's own input is
    sharded; the column-parallel module's input is not) — Korthikanti et al. 2022 §4.
    It is attention-score-like when it has as many elements as a softmax output in this
    layer and the same last dimension (bmm saves 3-D views of the 4-D scores).
    Tensors saved by a dropout op are its mask: on CPU and meta the unfused dropout keeps
    it in the activation dtype, where CUDA's fused kernel keeps one byte per element.
    """

    def __init__(self, exclude_keys: set, score_keys: set):
        self.exclude = exclude_keys
        self.score_keys = score_keys
        self.seen: dict = {}  # storage key -> bytes
        self.total = self.sharded = self.scores = self.dropout_masks = 0
        self.tp_sharded_now = False
        self.in_dropout_now = False

    def pack(self, t: torch.Tensor):
        key = _storage_key(t)
        if key not in self.exclude and key not in self.seen:
            nbytes = _storage_bytes(t)
            self.seen[key] = nbytes
            self.total += nbytes
            if self.tp_sharded_now:
                self.sharded += nbytes
            if t.dim() and (t.numel(), t.shape[-1]) in self.score_keys:
                self.scores += nbytes
            if self.in_dropout_now:
                self.dropout_masks += nbytes
        return t

    @staticmethod
    def unpack(t):
        return t


class _TPRegion:
    """Tracks whether the node being run sits inside a Megatron parallel region."""

    def __init__(self, colwise: tuple[str, ...], rowwise: tuple[str, ...]):
        self.colwise, self.rowwise = colwise, rowwise
        self.state = "closed"

    @staticmethod
    def _inside(path: str | None, modules: tuple[str, ...]) -> bool:
        return path is not None and any(path == m or path.startswith(m + ".") for m in modules)

    def enter(self, path: str | None) -> bool:
        """Advance to the next node; True if what it saves is TP-sharded."""
        if self._inside(path, self.colwise):
            self.state = "open_after"
            return False
        if self._inside(path, self.rowwise):
            self.state = "close_after"
            return True
        self.state = "open" if self.state in ("open_after", "open") else "closed"
        return self.state == "open"


# ------------------------------------------------------------------------ layer runs


@dataclass(frozen=True)
class LayerRun:
    """Figures from one forward+backward of one layer."""

    flops_fwd: int
    flops_bwd: int
    saved_bytes: int
    saved_tp_sharded_bytes: int
    saved_attention_bytes: int
    saved_dropout_mask_bytes: int
    saved_input_bytes: int
    saved_output_bytes: int
    ops_fwd: int = 0
    ops_bwd: int = 0
    random_elements_fwd: int = 0
    random_tp_sharded_elements_fwd: int = 0
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0


# ATen ops that draw random numbers (dropout masks): a CPU thread spends ~10x longer per
# element on them than a memory-bound op moving the same bytes, so the compute model
# prices their elements apart (`ClusterSpec.random_element_s`).
RANDOM_OPS = frozenset({"bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like",
                        "uniform_", "normal_", "randn", "randn_like"})


class _OpCounter(TorchDispatchMode):
    """Counts ATen ops dispatched (views and copies included): each costs a framework
    dispatch on the host, which is what small layers spend their time on. Also counts
    the elements random-number ops draw, and how many of them fall where tensor
    parallelism shards the activations (`tp_sharded_now`, set by the layer run)."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.random_elements = 0
        self.random_tp_sharded_elements = 0
        self.tp_sharded_now = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in RANDOM_OPS:
            drawn = next((t.numel() for t in _tensor_leaves(out)), 0)
            self.random_elements += drawn
            if self.tp_sharded_now:
                self.random_tp_sharded_elements += drawn
        return out


def _entered_if(condition: bool, *contexts) -> contextlib.ExitStack:
    """An ExitStack holding `contexts` when `condition`, else empty."""
    stack = contextlib.ExitStack()
    if condition:
        for context in contexts:
            stack.enter_context(context)
    return stack


def count_ops(fn: Callable[[], object]) -> int:
    """ATen ops `fn()` dispatches (the same count the layer IR records)."""
    counter = _OpCounter()
    with counter:
        fn()
    return counter.count


def _tensor_leaves(value) -> list[torch.Tensor]:
    out = []
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            out.extend(_tensor_leaves(v))
    elif isinstance(value, dict):
        for v in value.values():
            out.extend(_tensor_leaves(v))
    return out


def _nbytes(value) -> int:
    seen, total = set(), 0
    for t in _tensor_leaves(value):
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


@dataclass
class _LayerInfo:
    nodes: LayerNodes
    inputs: list[fx.Node]  # values from outside the layer (placeholders included)
    outputs: list[fx.Node]  # values used outside the layer
    module_paths: dict[fx.Node, str | None]


class GraphMeasurer:
    """Holds a traced graph, its layer grouping and forward values; measures layers."""

    def __init__(self, traced: Traced, inputs: dict[str, torch.Tensor], target, dtype):
        from ir.layers import node_module_path

        self.traced = traced
        self.dtype = dtype
        self.layers = group_nodes(traced.graph_module, traced.root, traced.module_prefix)
        self.user_values = self._user_values(inputs, target, meta=True)
        self.state, self.aliases = _make_state(traced, dtype, meta_factory)
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
        # Forward values (shapes) of every node: one pass over the whole graph, on meta.
        self.values: dict[fx.Node, object] = {}
        runner = self._runner(self.state)
        runner.env = self._placeholder_env(self.state, self.user_values)
        with torch.no_grad():
            for n in gm.graph.nodes:
                if n.op in ("placeholder", "output"):
                    continue
                runner.env[n] = runner.run_node(n)
        self.values = runner.env

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
            dtype = self.dtype if _float(t.dtype) else t.dtype
            values[name] = t.detach().to(device="meta" if meta else t.device, dtype=dtype)
        if target is not None:
            values[TARGET_INPUT] = target.detach().to(device="meta") if meta else target
        return values

    def _runner(self, state) -> _Runner:
        return _Runner(self.traced, state, self.aliases)

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
            h.update(repr([(tuple(t.shape), str(t.dtype)) for t in _tensor_leaves(v)]).encode())
        return h.hexdigest()[:16]

    def tp_modules(self, index: int, candidates) -> tuple[tuple[str, ...], tuple[str, ...]]:
        name = self.infos[index].nodes.name
        full = lambda m: f"{name}.{m}" if m else name  # noqa: E731
        col = tuple(full(c.module) for c in candidates if c.style is TPStyle.COLWISE)
        row = tuple(full(c.module) for c in candidates if c.style is TPStyle.ROWWISE)
        return col, row

    def run_layer(self, index: int, colwise=(), rowwise=(), factory: TensorFactory = meta_factory,
                  device: str = "meta", repeats: int = 1, warmup: int = 0) -> LayerRun:
        """Forward + backward of one layer on fresh inputs; FLOPs, saved bytes, seconds."""
        info = self.infos[index]
        state = self.state
        if factory is not meta_factory:  # materialise this layer's state only
            state, _ = _make_state(self.traced, self.dtype, factory, set(self.state_used(index)))
        score_keys = {(self.values[n].numel(), self.values[n].shape[-1]) for n in info.nodes.nodes
                      if "softmax" in str(n.target).lower()
                      and isinstance(self.values.get(n), torch.Tensor) and self.values[n].dim()}
        dropout_nodes = {n for n in info.nodes.nodes if self._is_dropout(n)}
        param_keys = {_storage_key(t) for t in state.values() if isinstance(t, torch.Tensor)}
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        fwd_times, bwd_times = [], []
        result = None
        # Run 0 measures (FLOP and op counters, saved-tensor hooks); timed runs go without
        # them: the instrumentation costs a Python call per op, more than a small op itself.
        timed_runs = warmup + repeats if repeats > 1 or warmup or factory is not meta_factory \
            else 0
        for rep in range(1 + timed_runs):
            measuring = rep == 0
            env = self._fresh_inputs(info, state, factory)
            runner = self._runner(state)
            runner.env = env
            log = _SavedTensorLog(param_keys, score_keys)
            region = _TPRegion(colwise, rowwise)
            fwd_counter, bwd_counter = FlopCounterMode(display=False), FlopCounterMode(display=False)
            fwd_ops, bwd_ops = _OpCounter(), _OpCounter()
            sync()
            start = time.perf_counter()
            with _entered_if(measuring,
                             torch.autograd.graph.saved_tensors_hooks(log.pack, log.unpack),
                             fwd_counter, fwd_ops):
                for n in info.nodes.nodes:
                    if measuring:
                        log.tp_sharded_now = region.enter(info.module_paths[n])
                        fwd_ops.tp_sharded_now = log.tp_sharded_now
                        log.in_dropout_now = n in dropout_nodes
                    runner.env[n] = runner.run_node(n)
            sync()
            mid = time.perf_counter()
            outs = [t for o in info.outputs for t in _tensor_leaves(runner.env[o])
                    if t.requires_grad and t.grad_fn is not None]
            if not outs and index == len(self.infos) - 1:
                outs = [t for t in _tensor_leaves(runner.env[info.nodes.nodes[-1]])
                        if t.requires_grad and t.grad_fn is not None]
            with _entered_if(measuring, bwd_counter, bwd_ops):
                if outs:
                    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            sync()
            end = time.perf_counter()
            if measuring:
                in_keys = {_storage_key(t) for a in info.inputs for t in _tensor_leaves(env.get(a))}
                out_keys = {_storage_key(t) for o in info.outputs
                            for t in _tensor_leaves(runner.env[o])}
                saved_in = sum(b for k, b in log.seen.items() if k in in_keys)
                saved_out = sum(b for k, b in log.seen.items() if k in out_keys)
                result = (int(fwd_counter.get_total_flops()), int(bwd_counter.get_total_flops()),
                          log.total, log.sharded, log.scores, log.dropout_masks, saved_in,
                          saved_out, fwd_ops.count, bwd_ops.count, fwd_ops.random_elements,
                          fwd_ops.random_tp_sharded_elements)
            elif rep > warmup:
                fwd_times.append(mid - start)
                bwd_times.append(end - mid)
            del runner, env, outs
        return LayerRun(*result, _median(fwd_times), _median(bwd_times))

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
            env[a] = _fresh(value, factory)
        return env


def _fresh(value, factory):
    """A detached stand-in for a boundary value; float tensors require grad."""
    if isinstance(value, torch.Tensor):
        t = factory(value.shape, value.dtype, "input")
        if _float(t.dtype):
            t.requires_grad_(True)
        return t
    if isinstance(value, tuple):
        return tuple(_fresh(v, factory) for v in value)
    if isinstance(value, list):
        return [_fresh(v, factory) for v in value]
    if isinstance(value, dict):
        return {k: _fresh(v, factory) for k, v in value.items()}
    return value


def _median(xs: list[float]) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


# ------------------------------------------------------------------------ the IR


def _grad_carrying(measurer: GraphMeasurer) -> set[fx.Node]:
    """Nodes whose value depends on a parameter (they carry gradients across cuts)."""
    out: set[fx.Node] = set()
    root = measurer.traced.root
    for n in measurer.traced.graph_module.graph.nodes:
        if n.op == "placeholder":
            name = measurer.traced.state_names.get(n.name)
            if name is not None and name in measurer.aliases:
                out.add(n)
        elif n.op == "call_module":
            module = measurer.traced.submodule(n.target)
            if any(True for _ in module.parameters()) or any(a in out for a in n.all_input_nodes):
                out.add(n)
        elif n.op == "get_attr":
            if str(n.target) in measurer.aliases:
                out.add(n)
        elif any(a in out for a in n.all_input_nodes):
            out.add(n)
    return out


def layer_graph_from_trace(traced: Traced, inputs, target, *, name: str, dtype: torch.dtype,
                           progress: Callable[[int, int, str], None] | None = None,
                           seq_len: int | None = -1) -> tuple[LayerGraph, GraphMeasurer]:
    measurer = GraphMeasurer(traced, inputs, target, dtype)
    root = traced.root
    vocab = largest_vocab(root)
    canon_params = dict(root.named_parameters())
    owned: set[str] = set()
    param_names_by_layer: list[list[str]] = []
    for i in range(len(measurer.layers)):
        names = [p for p in measurer.state_params_used(i) if p not in owned]
        owned.update(names)
        param_names_by_layer.append(names)
    # Parameters forward() never reads still take memory: give them to the layer whose
    # module holds them (or the first layer).
    layer_names = [l.name for l in measurer.layers]
    for pname in canon_params:
        if pname not in owned:
            best = 0
            for i, lname in enumerate(layer_names):
                for part in lname.split("+"):
                    if part and pname.startswith(part + "."):
                        best = i
            param_names_by_layer[best].append(pname)
            owned.add(pname)

    tied_by_layer = _tied_copies(root, layer_names, param_names_by_layer)
    local_names = names_in_layers(root, layer_names, param_names_by_layer)

    runs: dict[str, LayerRun] = {}
    layers: list[Layer] = []
    stacks = _stack_parents(root)
    n_layers = len(measurer.layers)
    for i, layer_nodes in enumerate(measurer.layers):
        info = measurer.infos[i]
        lname = layer_nodes.name
        module = None
        if "+" not in lname:
            module = root.get_submodule(lname) if lname else root
        in_block = "." in lname and lname.rsplit(".", 1)[0] in stacks
        candidates, divisors = ((), ())
        if module is not None:
            candidates, divisors = tp_analysis(module, in_block=in_block, vocab_rows=vocab)
        sp_ok = module is not None and sequence_parallel_problem(lname, module, candidates) is None
        shash = measurer.structural_hash(i)
        if progress:
            progress(i, n_layers, lname)
        if shash not in runs:
            col, row = measurer.tp_modules(i, candidates)
            runs[shash] = measurer.run_layer(i, col, row)
        run = runs[shash]
        pnames = tuple(param_names_by_layer[i])
        params = sum(canon_params[p].numel() for p in pnames)
        pbytes = sum(canon_params[p].numel() * _measured_itemsize(canon_params[p], dtype)
                     for p in pnames)
        owned_ids = {id(canon_params[p]) for p in pnames}
        tied = tied_by_layer[i]  # this layer's name -> the shared tensor
        tied_ids = {id(t) for t in tied.values()}
        tp_params = tied_tp = 0
        for c in candidates:
            sub = module.get_submodule(c.module) if c.module else module
            w, b = getattr(sub, "weight", None), getattr(sub, "bias", None)
            for t in (w, b) if c.style is TPStyle.COLWISE else (w,):
                if t is not None and id(t) in owned_ids:
                    tp_params += t.numel()
                elif t is not None and id(t) in tied_ids:
                    tied_tp += t.numel()
        tied_params = sum(t.numel() for t in {id(t): t for t in tied.values()}.values())
        in_bytes = sum(_nbytes(measurer.values.get(a, measurer.user_values.get(str(a.target))))
                       for a in info.inputs)
        out_bytes = sum(_nbytes(measurer.values[o]) for o in info.outputs
                        if not (o.op == "placeholder"))
        if i == n_layers - 1 and not info.outputs:
            out_bytes = _nbytes(measurer.values[layer_nodes.nodes[-1]])
        layers.append(Layer(
            name=lname, kind=layer_nodes.kind, index=i, params=params, param_bytes=pbytes,
            tp_params=tp_params, flops_fwd=run.flops_fwd, flops_bwd=run.flops_bwd,
            saved_activation_bytes=run.saved_bytes, saved_tp_sharded_bytes=run.saved_tp_sharded_bytes,
            saved_attention_bytes=run.saved_attention_bytes,
            saved_dropout_mask_bytes=run.saved_dropout_mask_bytes, input_bytes=in_bytes,
            output_bytes=out_bytes, structural_hash=shash, param_names=local_names[i],
            tp_candidates=candidates, tp_divisors=divisors,
            saved_input_bytes=run.saved_input_bytes, saved_output_bytes=run.saved_output_bytes,
            max_param_numel=max([canon_params[p].numel() for p in pnames]
                                + [t.numel() for t in tied.values()], default=0),
            ops_fwd=run.ops_fwd, ops_bwd=run.ops_bwd,
            random_elements_fwd=run.random_elements_fwd,
            random_tp_sharded_elements_fwd=run.random_tp_sharded_elements_fwd,
            tied_params=tied_params,
            tied_tp_params=tied_tp, tied_param_names=tuple(tied),
            chain_input=_chain_input(measurer, i, module), sequence_parallel_ok=sp_ok))
    edges, cuts = _edges_and_cuts(measurer)
    num_params = sum(p.numel() for p in root.parameters())
    seq_len = _seq_len(inputs) if seq_len == -1 else seq_len
    micro_batch = _batch_size(inputs)
    fingerprint = _fingerprint(layers, dtype, micro_batch, seq_len)
    graph = LayerGraph(model=name, trace_method=traced.method, dtype=str(dtype).replace("torch.", ""),
                       micro_batch=micro_batch, seq_len=seq_len, layers=tuple(layers),
                       edges=tuple(edges), num_params=num_params, fingerprint=fingerprint,
                       cut_points=tuple(cuts), unique_layers_measured=len(runs))
    return graph, measurer


def _chain_input(m: GraphMeasurer, i: int, module: nn.Module | None) -> bool:
    """Layer i's only outside input is one tensor owned by layer i-1, and its forward takes
    just that (`ir.legality.layout_change_problem`)."""
    if i == 0 or module is None or not takes_one_positional_input(module):
        return False
    # the loss target feeds the loss, which joined the last layer but runs outside it
    target = m.target_placeholder()
    outside = [a for a in m.infos[i].inputs if a is not target]
    return len(outside) == 1 and m.owner.get(outside[0]) == i - 1



def _tied_copies(root: nn.Module, layer_names: list[str],
                 owned: list[list[str]]) -> list[dict[str, torch.Tensor]]:
    """Per layer, {its parameter name: tensor} for tensors it holds a copy of but another
    layer owns. A layer holds every parameter registered under its module path (the
    longest layer name that prefixes the parameter's name; "" is the root), as
    `executors.tied` decides; `executors.tied.untie` then gives each holder its own copy,
    and the owner (`owned`, first use) counts the original."""
    owner = {p: i for i, names in enumerate(owned) for p in names}
    canon = _canonical_param_names(root)
    out: list[dict[str, torch.Tensor]] = [{} for _ in layer_names]
    holders: dict[int, dict[int, str]] = {}  # tensor id -> {holding layer: first name there}
    for fqn, p in root.named_parameters(remove_duplicate=False):
        best, best_len = None, -1
        for i, name in enumerate(layer_names):
            if (name == "" or fqn == name or fqn.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
        if best is not None:
            holders.setdefault(id(p), {}).setdefault(best, fqn)
    tensors = {id(p): p for p in root.parameters()}
    for pid, by_layer in holders.items():
        if len(by_layer) < 2:
            continue
        first_user = owner.get(canon[pid])
        for i, fqn in by_layer.items():
            if i != first_user:
                out[i][fqn] = tensors[pid]
    return out


def build_layer_graph(model: nn.Module, inputs: dict[str, torch.Tensor],
                      target: torch.Tensor | None = None, loss_fn: LossFn | None = None, *,
                      name: str | None = None, dtype: torch.dtype = torch.float32,
                      force_trace: str | None = None, seq_len: int | None = -1,
                      progress: Callable[[int, int, str], None] | None = None) -> LayerGraph:
    """Trace `model` and measure it into a LayerGraph (all on the meta device).
    `seq_len` is recorded as given; -1 guesses it (dim 1 of the first integer input)."""
    traced = trace(model, inputs, target, loss_fn, force=force_trace, dtype=dtype)
    graph, _ = layer_graph_from_trace(traced, inputs, target, name=name or type(model).__name__,
                                      dtype=dtype, progress=progress, seq_len=seq_len)
    return graph


def _measured_itemsize(t: torch.Tensor, dtype: torch.dtype) -> int:
    """Bytes per element of a parameter in the measurement dtype (integers keep theirs)."""
    return torch.empty((), dtype=dtype).element_size() if _float(t.dtype) else t.element_size()


def _stack_parents(root: nn.Module) -> set[str]:
    from ir.layers import _is_block_stack

    return {name for name, m in root.named_modules() if name and _is_block_stack(m)}


def _edges_and_cuts(m: GraphMeasurer) -> tuple[list[tuple[int, int, int]], list[int]]:
    grad = _grad_carrying(m)
    n_layers = len(m.layers)
    edge_bytes: dict[tuple[int, int], int] = {}
    crossing = [0] * (n_layers + 1)  # difference array of grad-carrying values per cut
    for node, src in m.owner.items():
        consumers = {m.owner[u] for u in node.users if u in m.owner and m.owner[u] != src}
        if not consumers:
            continue
        nbytes = _nbytes(m.values.get(node))
        for dst in consumers:
            edge_bytes[(src, dst)] = edge_bytes.get((src, dst), 0) + nbytes
        if node in grad and any(t.is_floating_point() for t in _tensor_leaves(m.values.get(node))):
            crossing[src] += 1
            crossing[max(consumers)] -= 1
    cuts, running = [], 0
    for i in range(n_layers - 1):
        running += crossing[i]
        if running <= 1:
            cuts.append(i)
    edges = [(s, d, b) for (s, d), b in sorted(edge_bytes.items())]
    return edges, cuts


def _seq_len(inputs: dict[str, torch.Tensor]) -> int | None:
    for t in inputs.values():
        if not _float(t.dtype) and t.dim() >= 2:
            return int(t.shape[1])
    return None


def _batch_size(inputs: dict[str, torch.Tensor]) -> int:
    for t in inputs.values():
        if t.dim() >= 1:
            return int(t.shape[0])
    return 1


def _fingerprint(layers, dtype, micro_batch, seq_len) -> str:
    """The layer digests at the traced shape (IR dtype, micro-batch, sequence): not the
    model's display name, its example values or its loss (see `layer_digest`)."""
    h = hashlib.sha256()
    h.update(repr((str(dtype), micro_batch, seq_len)).encode())
    for l in layers:
        h.update(layer_digest(l).encode())
    return h.hexdigest()[:16]
