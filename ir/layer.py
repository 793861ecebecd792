"""The layer IR: what a model is, layer by layer, as plain frozen data.

A `LayerGraph` is an ordered list of `Layer`s (topological order of the traced graph) plus
the edges between them. Everything downstream (cost models, search, executors) reads
only this; nothing here knows about costs or strategies.

All byte and FLOP figures are for ONE micro-batch of the shape the graph was measured
with (`LayerGraph.micro_batch`, `LayerGraph.seq_len`) in `LayerGraph.dtype`; cost models
scale them linearly with the micro-batch size.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
from dataclasses import dataclass, field, fields

import networkx as nx

from ir.kernel_records import KernelRecords


class TPStyle(str, enum.Enum):
    """How a Linear/Embedding splits under Megatron-style tensor parallelism."""

    COLWISE = "colwise"  # output features split (q/k/v, MLP up/gate); no comm in forward
    ROWWISE = "rowwise"  # input features split (attention out, MLP down); all-reduce after
    VOCAB = "vocab"  # embedding table split over the vocabulary; all-reduce after lookup
    HEAD = "head"  # output projection over the vocabulary (loss-parallel)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class TPCandidate:
    """One module a TP degree would split. `module` is relative to the layer's module.
    `fused`: the output features of the projections a fused column-parallel module packs
    side by side, in the model's order ((q, k, v) or (gate, up)); () for a plain one.
    Each part is split t ways and rank r holds its r-th piece of every part
    (`executors.fused`). `shared`: per part, held whole by every rank instead
    (`ir.tp.fused_shared`, multi-query attention's one key/value head); () = none."""

    module: str
    style: TPStyle
    params: int
    fused: tuple[int, ...] = ()
    shared: tuple[bool, ...] = ()

    def split_numel(self, numel: int) -> int:
        """Of a tensor of `numel` elements along this module's output features, the
        elements TP divides: a shared part's rows are replicated on every rank."""
        if not any(self.shared):
            return numel
        split_features = sum(n for n, whole in zip(self.fused, self.shared) if not whole)
        return numel // sum(self.fused) * split_features

    def __str__(self) -> str:
        parts = f"[{'|'.join(map(str, self.fused))}]" if self.fused else ""
        return f"{self.module}:{self.style}{parts}"


@dataclass(frozen=True, slots=True)
class LayerMeasurement:
    """What one forward + backward of a layer measures (one micro-batch, on meta tensors:
    `ir.graph_measurer`). A new figure is one field here, set where it is measured; a
    `Layer` reads it under the same name (`layer.flops_fwd`).

    Saved-activation bytes:
      saved_activation_bytes   all tensors autograd keeps for backward (deduplicated by
                               storage, parameters excluded): the "no parallelism" figure.
      saved_tp_sharded_bytes   the part Megatron TP splits t ways (tensors saved between a
                               column-parallel and the next row-parallel module).
      saved_attention_bytes    the part that is attention scores (softmax, its dropout
                               mask and output: Korthikanti's 5·a·s²·b); selective
                               recomputation drops it.
      saved_dropout_mask_bytes the part that is dropout masks, as measured (CPU/meta keep
                               them in the activation dtype; CUDA's fused dropout keeps
                               1 byte per element: see `Layer.saved_bytes_on`).
      saved_rms_norm_excess_bytes  what RMSNorm calls save as measured (CPU/meta's
                               decomposition) beyond what CUDA's fused kernel saves for
                               them (`ir.saved_tensors.RMSNormCalls`); ..._tp_sharded_...
                               the part of it saved where TP shards.
    """

    flops_fwd: int = 0
    flops_bwd: int = 0
    saved_activation_bytes: int = 0
    saved_tp_sharded_bytes: int = 0
    saved_attention_bytes: int = 0
    saved_dropout_mask_bytes: int = 0
    saved_rms_norm_excess_bytes: int = 0
    saved_rms_norm_tp_sharded_excess_bytes: int = 0
    # Saved tensors that are the layer's own inputs / outputs: a boundary tensor saved by
    # both neighbours (a ReLU output the next conv saves as input) is held once.
    saved_input_bytes: int = 0
    saved_output_bytes: int = 0
    # ATen ops one forward / backward dispatches (views included): host overhead scales
    # with them, and on small layers it is most of the time.
    ops_fwd: int = 0
    ops_bwd: int = 0
    # Distinct ATen op overloads among the forward's ops (`ir.op_count.OpCounter
    # .distinct_ops`): each has its own code and data, and a run of more than a cache holds
    # costs each op more than a probe's tight loop (`cost_models.sequence_probes
    # .in_sequence_cost`); 0 where not counted.
    distinct_ops_fwd: int = 0
    # ... their names (`OpCounter.overload_names`), and the backward's: a layer's cold ops
    # are those of these the layer before it did not run (`Layer.cold_distinct_ops_fwd`);
    # empty where not counted.
    forward_overloads: frozenset[str] = frozenset()
    backward_overloads: frozenset[str] = frozenset()
    # fx call nodes of the forward that dispatch no ATen op (`x.shape`, `getitem`, size
    # arithmetic, `float()` of a float tensor): each is a line of generated Python the host
    # runs (`ir.op_count.python_nodes`); 0 where not counted.
    python_nodes_fwd: int = 0
    # fx call nodes of the forward that dispatch only views (`x.view`, `transpose`, a
    # slice, `flatten`): each calls its first view from Python, the others from C++
    # (`ir.graph_measurer.view_nodes`); 0 where not counted.
    python_view_nodes_fwd: int = 0
    # Autograd nodes one backward runs (the graph walked from the layer's outputs, each
    # parameter's gradient accumulation included: `ir.op_count.autograd_nodes`); 0 where
    # not counted.
    autograd_nodes_bwd: int = 0
    # Autograd nodes the forward records (a grad_fn per op whose output needs a gradient:
    # the same walk without the parameters' accumulations); 0 where not counted.
    autograd_nodes_fwd: int = 0
    # Elements one forward draws at random (dropout masks), and the part drawn where TP
    # shards the activations (between a column- and a row-parallel module).
    random_elements_fwd: int = 0
    random_tp_sharded_elements_fwd: int = 0
    # ---- kernel records (ir.kernel_records): every ATen op of one forward and backward,
    # aggregated per (op, shape, dtype); the kernel-level time model prices them. None
    # for layers not measured by a trace (cost_models.synthetic).
    kernels: KernelRecords | None = None
    # ---- checkpointed runs (`ir.checkpoint_measure`: the layer run as the executor
    # checkpoints it). Kept: bytes held from forward to backward under SELECTIVE besides
    # the checkpoint's inputs, by what TP does to them (split t ways; made by a row-parallel
    # module, whole under TP). Backward: the most bytes its backward holds above its start
    # (recomputed tensors, gradients inside the layer and of its inputs), per mode.
    selective_kept_bytes: int = 0
    selective_kept_tp_sharded_bytes: int = 0
    selective_kept_rowwise_bytes: int = 0
    # ... and the share of the layer's parameter gradients made by that peak (1: all).
    selective_backward_bytes: int = 0
    selective_backward_grad_share: float = 1.0
    full_backward_bytes: int = 0
    full_backward_grad_share: float = 1.0
    # Tensors one forward saves for backward, each save counted (parameters and repeated
    # storages included: `SavedTensorLog.calls`): a checkpointed layer pays a saved-tensor
    # hook per save (`cost_models.checkpoint_probes`); 0 where not counted.
    saved_tensors_fwd: int = 0
    # Of those, the saves of tensors that require grad (a checkpoint's recompute detaches
    # each: `SavedTensorLog.grad_calls`), and the forward ops from the last save on, which
    # its recompute does not rerun (early stop: `SavedTensorLog.ops_after_last_save`)
    saved_grad_tensors_fwd: int = 0
    ops_after_last_save_fwd: int = 0
    # Per module owning parameters outside the TP candidates (path relative to the layer),
    # the ATen ops its forward and its backward dispatch: those the TP executor runs on
    # DTensors (`ir.dtensor_ops`); () where not counted.
    replicated_module_ops: tuple[tuple[str, int, int], ...] = ()
    # Row-parallel module calls ending before the forward's last save: the reductions a
    # full recompute issues again (`ir.tp_recompute`); None where not counted.
    rowwise_before_last_save_fwd: int | None = None


MEASURED_FIGURES = frozenset(f.name for f in fields(LayerMeasurement))


@dataclass(frozen=True, slots=True)
class Layer:
    """One schedulable unit: a repeated block, an embedding, a final norm, a head.

    Its FLOPs, saved-activation bytes, op counts and random draws are one
    `LayerMeasurement` (`measured`), readable as the layer's own attributes
    (`layer.saved_activation_bytes`). Boundary figures (bytes, one micro-batch):
      input_bytes              tensors entering the layer (what full checkpointing keeps).
      output_bytes             tensors leaving the layer (the pipeline boundary).
      gradless_input_bytes     the part of input_bytes a step's backward makes no gradient
                               for: the model's data (`ir.stand_in.is_data`), integer ids
                               and masks; 0 (all inputs get one) for hand-built layers.
      gradless_tp_inputs       the TP candidates (`TPCandidate.module`) whose inputs all
                               get no gradient (a column-parallel first Linear fed the
                               data): their input-gradient all-reduce never runs.
    """

    name: str  # module path, e.g. "blocks.17"; "" only for root-level glue
    kind: str  # module class name, e.g. "GPTBlock"
    index: int
    params: int  # parameters first used by this layer (tied weights counted once: tied_params)
    param_bytes: int
    tp_params: int  # parameters that tensor parallelism divides
    input_bytes: int
    output_bytes: int
    structural_hash: str  # identical blocks share it and are measured once
    measured: LayerMeasurement
    gradless_input_bytes: int = 0
    gradless_tp_inputs: tuple[str, ...] = ()
    param_names: tuple[str, ...] = ()  # fully qualified parameter names owned by this layer
    tp_candidates: tuple[TPCandidate, ...] = ()
    tp_divisors: tuple[tuple[str, int], ...] = ()  # ("heads", 96): a TP degree must divide each
    max_param_numel: int = 0  # largest parameter it holds, tied copies included (optimizer temporaries)
    # Elements of each parameter it holds, tied copies included, in the model's
    # named_parameters order (the order torch's optimizer steps them); () for hand-built layers.
    param_numels: tuple[int, ...] = ()
    # ... and each one's name under the layer's module path ("out.weight"), in the same
    # order: what TP splits is told by name (`cost_models.step_temporaries`), not by a size
    # two tensors may share; position-free (a stack's blocks agree); () for hand-built layers.
    param_step_names: tuple[str, ...] = ()
    # Weights this layer shares with an earlier layer (a tied embedding / LM head): counted
    # in that layer's `params`, but the executor gives this layer its own copy
    # (`executors.tied.untie`), with its own gradient and optimizer state. Names are this
    # layer's fully qualified names of the shared tensors; `tied_tp_params` is the part
    # TP divides (the copy sits in one of this layer's TP candidates).
    tied_params: int = 0
    tied_tp_params: int = 0
    tied_param_names: tuple[str, ...] = ()
    # Per name above, the index of the layer that owns the shared tensor (its first user):
    # with it, a tie's holders are the owner and the layers naming it here
    # (`cost_models.tied_memory.tied_copies`); () for layers built before it.
    tied_owner_layers: tuple[int, ...] = ()
    # ... and the tensor's own name (its first registered name in the model): one owner
    # layer may own several shared tensors; () for layers built before it.
    tied_owner_params: tuple[str, ...] = ()
    # ... and each shared tensor's elements: a layer may copy two, two tie groups each
    # summed on its own (`executors.tied`); () for layers built before it.
    tied_param_numels: tuple[int, ...] = ()
    # Legality facts read from the module at trace time (`ir.legality`): the layer's only
    # input is one tensor made by the layer before it (its batch can be re-split when the
    # data-parallel degree changes), and sequence parallelism can run it.
    chain_input: bool = True
    sequence_parallel_ok: bool = False
    # Distinct forward ops the layers just before it (in this order: the one before, and
    # earlier ones while fewer than a cache's worth of distinct ops ran since,
    # `ir.op_count.recent_forward_ops`) did not run; for the first,
    # those its own backward did not (a step's last backward, then the optimizer, precede
    # its forward: `ir.op_count.cold_distinct_ops`). A step runs them with their code and
    # data out of the caches (`cost_models.cold_entry_probes.cold_entry_cost`). Per position,
    # not per structure: a stack's first block follows the embedding, the others a block.
    # With the ops its composites run inside that those did not (`ir.composite_ops.cold_ops_fwd`).
    cold_distinct_ops_fwd: int = 0
    # ... and of its backward, in backward order: those the layer after's backward did not
    # run; for the last, those its own forward did not (`ir.op_count.cold_distinct_ops_bwd`).
    cold_distinct_ops_bwd: int = 0
    # Whether a whole step's distinct ops fit in the caches (`ir.op_count.step_evicts`
    # false: mlp-small's 12): then its forward starts warm and nothing of it is priced cold
    # (`cost_models.host_dispatch.forward_host_seconds`); False where not counted.
    step_warm: bool = False
    # Whether its forward follows a backward, not another layer's forward (a step's first
    # layer: the step before ends with its backward, then the optimizer); its cold ops are
    # those its backward did not run (`ir.op_count.cold_distinct_ops`). Set at trace time
    # for the model order; a plan's stage entries get it per pass from the schedule's
    # order (`cost_models.step_host.placed_layers`).
    forward_after_backward: bool = False
    # ... and the ATen ops its composite backward ops run inside on the CPU (an embedding
    # bag's ~20) that the layer after's backward did not run (`ir.composite_ops`): priced
    # as cold backward ops beside those above.
    cold_inner_ops_bwd: int = 0
    # ATen ops a step runs after it between its backward and its next forward, as `planner
    # profile` runs them (`cost_models.layer_profile.StepNeighbours`): its backward
    # window's forwards and backwards (the last layer: its window before's,
    # `ir.op_count.recent_window_layers`); and whether the layer just before runs the same
    # forward ops (a table after a table). Its forward's entry is priced by them
    # (`cost_models.host_dispatch.cold_entry_seconds`).
    after_ops: int = 0
    same_code_before: bool = False
    # ... and the bytes those layers' kernels move (their records' `total_bytes`, forward
    # and backward): what grows with the micro-batch between two forwards. No price reads
    # it yet: bench/bench_entry_footprint.py measures the entry it costs (most of t5-tiny's
    # relative biases' growth with the micro-batch).
    after_bytes: int = 0
    # ATen ops the layers of its backward window (`ir.op_count.recent_window_layers` over
    # the layers after) run between its forward and its backward, forward and backward
    # (the last layer: the layers before's, their forwards twice, `op_count.step_between`):
    # its cold backward ops are priced by them (`host_dispatch.backward_host_seconds`).
    backward_after_ops: int = 0
    # Per pass, its distinct memory ops that the work just before it ran too, each with the
    # bytes run since, (op, weight bytes, activation bytes) at the traced micro-batch
    # (`ir.op_count.recent_code_bytes`): their cold kernel code is read at these bytes
    # where fewer than the pass's own (`cost_models.cold_kernel`).
    recent_ops_fwd: tuple[tuple[str, int, int], ...] = ()
    recent_ops_bwd: tuple[tuple[str, int, int], ...] = ()

    def __getattr__(self, name: str):
        # Reached only when no field matches: a measured figure reads as the layer's own.
        if name in MEASURED_FIGURES:
            return getattr(self.measured, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __str__(self) -> str:
        return f"{self.name}({self.kind})"

    def position_free(self) -> Layer:
        """This layer with what depends on where it sits blanked (name, index, parameter
        names, cold-op counts): equal for a stack's blocks, whose memory and kernels do not
        depend on their place."""
        return dataclasses.replace(self, name="", index=0, param_names=(), tied_owner_layers=(),
                                   tied_owner_params=(),
                                   cold_distinct_ops_fwd=0, cold_distinct_ops_bwd=0,
                                   cold_inner_ops_bwd=0, forward_after_backward=False,
                                   after_ops=0, same_code_before=False,
                                   after_bytes=0, backward_after_ops=0,
                                   recent_ops_fwd=(), recent_ops_bwd=())

    @property
    def param_tensors(self) -> int:
        """Parameter tensors this layer's module holds when it runs: its own and its tied
        copies (`executors.tied.untie` gives each its own tensor, gradient and step)."""
        return len(self.param_names) + len(self.tied_param_names)

    @property
    def host_position(self) -> tuple[int, int]:
        """The per-position counts the host time reads (cold ops forward, backward): layers
        of one structure price apart where these differ (`host_dispatch.host_position_key`)."""
        return self.cold_distinct_ops_fwd, self.cold_distinct_ops_bwd + self.cold_inner_ops_bwd

    def saved_bytes_on(self, device_type: str, dtype_bytes: int) -> int:
        """Saved-activation bytes on `device_type` ("cuda" prices dropout masks at 1 byte
        per element, as the fused CUDA dropout kernel stores a bool mask, and RMSNorm's
        saves as its fused kernel keeps them: `rms_norm_excess_on`)."""
        if device_type != "cuda":
            return self.saved_activation_bytes
        masks = self.saved_dropout_mask_bytes
        mask_excess = masks - masks // dtype_bytes if dtype_bytes > 1 else 0
        return (self.saved_activation_bytes - mask_excess
                - self.rms_norm_excess_on(device_type)[0])

    def rms_norm_excess_on(self, device_type: str) -> tuple[int, int]:
        """(all, TP-sharded) saved bytes the IR's RMSNorm calls count beyond what they
        keep on `device_type`: CUDA runs the fused kernel (`ir.saved_tensors.
        RMS_NORM_CALLS`), CPU the decomposition the IR measured (0, 0)."""
        if device_type != "cuda":
            return 0, 0
        return self.saved_rms_norm_excess_bytes, self.saved_rms_norm_tp_sharded_excess_bytes

    def tp_degree_allowed(self, tp: int) -> bool:
        """A TP degree is legal if it divides every constraint. A layer with nothing to
        split runs replicated inside its TP group (Megatron's layer norms)."""
        return all(value % tp == 0 for _, value in self.tp_divisors)

    def tp_violation(self, tp: int) -> str | None:
        """Why `tp` is illegal for this layer, or None."""
        for what, value in self.tp_divisors:
            if value % tp:
                return f"layer {self.name}: tp={tp} does not divide {what}={value}"
        return None


# Each measured figure as a property of the layer: what `__getattr__` answers, without the
# failed slot lookup before it (the search reads them some 10^5 times).
for _name in MEASURED_FIGURES - set(dir(Layer)):
    setattr(Layer, _name, property(operator.attrgetter(f"measured.{_name}")))


@dataclass(frozen=True, slots=True)
class LayerGraph:
    """The whole model as ordered layers plus the edges that cross between them."""

    model: str
    trace_method: str  # "fx" or "export"
    dtype: str  # dtype activations were measured in: "float32", "bfloat16", ...
    micro_batch: int
    seq_len: int | None
    layers: tuple[Layer, ...]
    edges: tuple[tuple[int, int, int], ...]  # (src layer, dst layer, bytes)
    num_params: int
    fingerprint: str  # hash of the layer IR; plans name it
    cut_points: tuple[int, ...] = ()  # i: a pipeline may cut between layer i and i+1
    # the cut points no value carrying a gradient crosses (only the model's data and
    # values made from it: `ir.stand_in.is_data`): no gradient flows back over them
    gradless_cuts: tuple[int, ...] = ()
    unique_layers_measured: int = 0
    _graph: nx.DiGraph | None = field(default=None, compare=False, hash=False, repr=False)

    def __len__(self) -> int:
        return len(self.layers)

    def __str__(self) -> str:
        return f"LayerGraph({self.model}, {len(self.layers)} layers, {self.num_params:,} params)"

    @property
    def graph(self) -> nx.DiGraph:
        """A networkx DiGraph of layer indices, edges weighted by bytes crossing."""
        if self._graph is not None:
            return self._graph
        g = nx.DiGraph()
        g.add_nodes_from(range(len(self.layers)))
        for src, dst, nbytes in self.edges:
            g.add_edge(src, dst, bytes=nbytes)
        return g

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        known = ", ".join(l.name for l in self.layers[:8])
        raise KeyError(f"no layer named {name!r} in {self.model} (layers: {known}, ...)")

    def carries_gradient(self, cut: int) -> bool:
        """Whether a pipeline cut after layer `cut` sends a gradient back: the next stage
        receives a tensor that requires grad (torch.distributed.pipelining gives a stage's
        received activation the sender's requires_grad), so it computes its input's
        gradient and sends it back; over a gradless cut it does neither."""
        return cut not in self.gradless_cuts

    def crossing_bytes(self, cut: int) -> int:
        """Bytes flowing from layers [0..cut] to layers [cut+1..]: a pipeline boundary."""
        return sum(b for s, d, b in self.edges if s <= cut < d)

    @property
    def flops_fwd(self) -> int:
        return sum(l.flops_fwd for l in self.layers)

    @property
    def flops_bwd(self) -> int:
        return sum(l.flops_bwd for l in self.layers)
