"""Activation memory of one layer for one micro-batch, under TP, SP and checkpointing.

Without checkpointing, Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", section 4) split a block's saved activations into the part
tensor parallelism shards (between a column- and the next row-parallel Linear: 24 of
the 34 s*b*h, plus the attention scores 5*a*s^2*b) and the part it leaves replicated
(layer norms, dropout masks and residual inputs: 10 s*b*h). The IR measures both.
Checkpointed layers are priced from what the IR measured running them as the executor
does (`ir.checkpoint_measure`): SELECTIVE is op-level selective checkpointing
(`ir.checkpoint_policy`: linear matmul and collective outputs kept), not Korthikanti's
"drop the attention scores".

| strategy       | bytes kept per micro-batch                                          |
|----------------|---------------------------------------------------------------------|
| none           | saved                                                               |
| TP t           | (saved - sharded) + sharded / t                                     |
| TP t + SP      | saved / t                                                           |
| selective      | inputs + kept matmul outputs: column-parallel ones / t, row-parallel |
|                | partial sums whole, plus the outputs of the collectives TP adds     |
| full           | inputs (/ t with SP)                                                |

A checkpointed layer rebuilds its activations in backward: `recompute_bytes` is the
peak of its backward above what it kept, as measured (split by TP as its saved set is),
held for one layer at a time. `activation_bytes` is plain arithmetic, elementwise on
numpy arrays as well.

Where the executor departs from Megatron, `layer_activations` follows the executor:
sequence parallelism applies only to layers with column/row-parallel linears
(`sequence_parallel_applies`), and DTensor keeps the all-gathered, full-sequence input
of each module holding column-parallel linears for their backward, where Megatron keeps
its sequence shard and gathers again in backward (`sp_gathered_input_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.layer import Layer, TPStyle
from ir.legality import sequence_parallel_applies
from ir.strategy import Checkpoint, LayerStrategy

from cost_models.common import StepConfig, dtype_bytes
from cost_models.layer_memo import layout_view, per_layer

# Score-shaped tensors attention saves when dropout follows softmax: the softmax output,
# the dropout mask and the dropout output (Korthikanti et al. 2022, sec. 4.1).
SCORE_TENSORS_WITH_DROPOUT = 3
# Logits-sized tensors alive at the start of a loss head's backward (see layer_activations).
LOSS_BACKWARD_LOGITS_COPIES = 2


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """Bytes for ONE micro-batch on one rank."""

    kept_bytes: float  # held from the layer's forward until its backward
    # held by its backward at its peak beyond the kept bytes and grad_flow_bytes: rebuilt
    # activations when checkpointed, else the measured backward's temporaries (or 0)
    recompute_bytes: float
    grad_flow_bytes: float  # gradients entering and leaving the layer during its backward
    # Share of the layer's parameter gradients already made when its backward peaks
    # (measured for checkpointed layers; 1: all of them, the bound used otherwise).
    backward_grad_share: float = 1.0
    # A loss head's logits-sized gradient and its output's and input's gradients
    # (None for other layers): see end_flow_bytes and reduce_flow_bytes.
    logits_grad_bytes: float = 0.0
    plain_flow_bytes: float | None = None

    @property
    def end_flow_bytes(self) -> float:
        """Gradients alive at the end of its backward: a loss head's matmul, making its
        weight gradient and its input's, reads the logits' gradient alone (the
        log-probabilities' one is freed with the log-softmax's backward)."""
        if self.plain_flow_bytes is None:
            return self.grad_flow_bytes
        return self.plain_flow_bytes + self.logits_grad_bytes

    @property
    def reduce_flow_bytes(self) -> float:
        """Gradients alive when FSDP2's post-backward hook reduces its unit (it runs once
        the gradients of the unit's inputs exist): no logits-sized one is left."""
        return self.grad_flow_bytes if self.plain_flow_bytes is None else self.plain_flow_bytes


def activation_bytes(saved, tp_sharded, input_bytes, tp, sequence_parallel, full):
    """Kept bytes of one layer without checkpointing or under FULL (Korthikanti et al.
    2022, Table 2). `saved`, `tp_sharded`, `input_bytes` are the IR's figures already
    scaled to the micro-batch and dtype; the booleans select the row of the table above.
    """
    # Korthikanti eq. 2 (TP): 10 sbh replicated + (24 sbh + 5 a s^2 b) / t sharded;
    # eq. 3/4 (TP + SP): everything / t because the replicated part is sequence-split.
    resident = _tp_split(saved, tp_sharded, tp, sequence_parallel)
    # Full recomputation keeps only the layer input (2 sbh, or 2 sbh / t with SP).
    return (input_bytes / tp ** sequence_parallel) * full + resident * (1 - full)


def selective_kept_bytes(layer: Layer, tp: int, sequence_parallel: bool, scale: float) -> float:
    """Bytes SELECTIVE keeps (`ir.checkpoint_policy`), as the IR measured them split by
    TP (`ir.checkpoint_measure`): the checkpoint's inputs, column-parallel matmul outputs
    / t, row-parallel partial sums whole (DTensor's Partial local result), and under
    TP the output of each row-parallel module's collective, which the policy keeps:
    the all-reduce (whole) or, with SP, the reduce-scatter (/ t)."""
    sharded = layer.selective_kept_tp_sharded_bytes
    rowwise = layer.selective_kept_rowwise_bytes
    replicated = layer.selective_kept_bytes - sharded - rowwise
    split = tp if sequence_parallel else 1
    kept = layer.input_bytes / split + replicated / split + sharded / tp + rowwise
    if tp > 1:
        n_rowwise = sum(c.style is TPStyle.ROWWISE for c in layer.tp_candidates)
        kept += n_rowwise * layer.output_bytes / split
    return kept * scale


def _tp_split(saved, sharded, tp, sequence_parallel):
    """saved bytes under TP (sharded part / t) or TP + SP (all / t)."""
    tp_only = saved - sharded + sharded / tp
    return (saved / tp) * sequence_parallel + tp_only * (1 - sequence_parallel)


@per_layer
def scaled_saved_bytes(layer: Layer, config: StepConfig) -> tuple[float, float, float]:
    """(saved, TP-sharded, attention) bytes for the config's micro-batch, dtype and device.

    Dropout masks scale by `mask_scale` (1 byte per element on CUDA), the rest by
    `activation_scale`. The IR gives the masks' total; we place an attention-shaped
    mask inside the attention (and TP-sharded) bytes as one of the three equal
    score-shaped tensors dropout-after-softmax saves (softmax output, mask, dropout
    output: Korthikanti et al. 2022's 2 + 1 + 2 bytes per a*s^2*b), the rest of the
    masks (after attention output and MLP) in the replicated part. On CUDA, RMSNorm
    keeps what its fused kernel saves, less than the decomposition the IR measured
    (`Layer.rms_norm_excess_on`).
    """
    masks = layer.saved_dropout_mask_bytes
    attention_masks = min(masks, layer.saved_attention_bytes / SCORE_TENSORS_WITH_DROPOUT)
    act, mask = config.activation_scale, config.mask_scale
    norms, sharded_norms = layer.rms_norm_excess_on(config.device_type)
    saved = (layer.saved_activation_bytes - masks - norms) * act + masks * mask
    sharded = ((layer.saved_tp_sharded_bytes - attention_masks - sharded_norms) * act
               + attention_masks * mask)
    attention = (layer.saved_attention_bytes - attention_masks) * act + attention_masks * mask
    return saved, sharded, attention


@per_layer
def logits_bytes(layer: Layer, config: StepConfig) -> float:
    """Bytes of a vocabulary head's logits, b*s*V elements (0 for other layers).

    V is the head's "vocab" TP divisor; b and s are the micro-batch and the IR's sequence."""
    if not config.seq_len or not any(c.style is TPStyle.HEAD for c in layer.tp_candidates):
        return 0.0
    vocab = max((v for what, v in layer.tp_divisors if what.endswith("vocab")), default=0)
    return (config.graph_micro_batch * config.seq_len * vocab * dtype_bytes(config.graph_dtype)
            * config.activation_scale)


def _loss_head(logits, saved, sharded, kept, recompute, tp, sp, checkpointed, config):
    """Adjust a vocabulary head's figures for its logits-sized log-probabilities.

    Loss-parallel TP (Megatron's vocab-parallel cross-entropy) keeps them split over the
    vocabulary, so whatever part of them the IR left replicated is divided by t here (SP
    already divided everything). fp16-mixed computes the loss in fp32 (the executor
    upcasts the logits: `Precision.loss_bytes`), so they take 4 bytes per element, not
    2; bf16-mixed computes it in bf16 (priced in fp32, a bf16 CPU step of a 32K-vocabulary
    llama was over-predicted 49%, issue 17). Returns (kept, recompute, logits bytes as
    the loss holds them).
    """
    log_probs = min(logits, saved)
    if tp > 1 and not sp:
        unsplit = min(log_probs, max(saved - sharded, 0.0)) * (1 - 1 / tp)
        kept, recompute = ((kept, recompute - unsplit) if checkpointed
                           else (kept - unsplit, recompute))
    upcast = config.precision.loss_bytes / config.precision.compute_bytes
    if upcast > 1:
        extra = log_probs * (upcast - 1) / tp
        kept, recompute = ((kept, recompute + extra) if checkpointed
                           else (kept + extra, recompute))
    return kept, recompute, logits * upcast


def measured_backward_bytes(layer: Layer, selective: bool, config: StepConfig) -> float:
    """The peak of the layer's checkpointed backward the IR measured (`ir.checkpoint_measure`,
    SELECTIVE or FULL) at the config's micro-batch and dtype. That peak holds the recomputed
    saved tensors, RMSNorm's as the decomposition keeps them: on CUDA, as the fused kernel
    does (`Layer.rms_norm_excess_on`, as `scaled_saved_bytes` counts them)."""
    measured = layer.selective_backward_bytes if selective else layer.full_backward_bytes
    excess = layer.rms_norm_excess_on(config.device_type)[0]
    return max(0.0, measured - excess) * config.activation_scale


def _plain_backward(layer: Layer, saved: float, sharded: float, tp: int, sp: bool,
                    config: StepConfig) -> tuple[float, float]:
    """(bytes a layer's backward holds above its kept activations and the gradients
    flowing through it, share of its parameter gradients made by its peak) without
    checkpointing, from the IR's FULL run (`ir.checkpoint_measure`): once FULL has
    recomputed, its backward runs the same ops on the same saved tensors as a plain one,
    so the plain backward's peak is FULL's less what FULL rebuilt (the saved tensors
    but the saved inputs, which a checkpoint keeps), and it comes with the same share
    of the gradients made. The input's gradient inside FULL's peak is in grad_flow_bytes.
    (Without the measurement the walk holds all activations and the whole new gradient
    at once, a bound: t5-tiny's decoder block had made one weight gradient, 32 KB of
    its 197 KB, by its peak measured under ZeRO-3, issue 17.)"""
    scale = config.activation_scale
    split = _tp_split(saved, sharded, tp, sp) / saved if saved else 1.0
    sequence_split = tp if sp else 1
    rebuilt = (saved - layer.saved_input_bytes * scale) * split
    backward = measured_backward_bytes(layer, False, config) * split
    return (max(0.0, backward - rebuilt - grad_input_bytes(layer) * scale / sequence_split),
            layer.full_backward_grad_share)


def boundary_bytes(crossing_bytes: float, source: StepConfig, tp: int, sp: bool) -> float:
    """Bytes of one micro-batch crossing a cut after a layer laid out (`tp`, `sp`), as each
    TP rank holds and sends them: one replica's activation at the layer's own micro-batch
    (`source`), sequence-split under SP (Korthikanti et al. 2022 sec. 4.2.2). The one rule
    the sends (`estimate.boundary_send_s`), the walk's buffers (`memory`) and the search's
    floor (`planner.layer_tables.buffers_floor`) read."""
    return crossing_bytes * source.activation_scale / (tp if sp else 1)


def grad_input_bytes(layer: Layer) -> int:
    """Bytes of the gradients a layer's backward makes for its inputs: none for the model's
    data or integer ids (`Layer.gradless_input_bytes`), as a step runs them."""
    return layer.input_bytes - layer.gradless_input_bytes


def sp_gathered_modules(layer: Layer) -> dict[str, tuple[str, ...]]:
    """The modules whose input SP all-gathers, each with its column-parallel linears: the
    parent of each (the executor's `_gather_sequence_hook` on the attention and MLP
    modules)."""
    parents: dict[str, tuple[str, ...]] = {}
    for c in layer.tp_candidates:
        if c.style is TPStyle.COLWISE:
            parent = c.module.rsplit(".", 1)[0] if "." in c.module else ""
            parents[parent] = parents.get(parent, ()) + (c.module,)
    return parents


def sp_gathered_input_bytes(layer: Layer, config: StepConfig) -> float:
    """Full-sequence bytes of the inputs DTensor all-gathers under SP, one per gathered
    module (`sp_gathered_modules`; the linears save the gathered Replicate tensor for
    their weight gradients). Each is a residual-stream tensor, the layer's output shape:
    Korthikanti et al. 2022's QKV and first-MLP-linear inputs (2sbh each)."""
    return len(sp_gathered_modules(layer)) * layer.output_bytes * config.activation_scale


def layer_activations(layer: Layer, strategy: LayerStrategy,
                      config: StepConfig) -> LayerActivations:
    """Activation bytes of `layer` for one micro-batch of `config.micro_batch` samples; they
    read the strategy's TP degree, SP and checkpoint mode alone (`layout_view`)."""
    return _layer_activations(layer, layout_view(strategy), config)


@per_layer
def _layer_activations(layer: Layer, strategy: LayerStrategy,
                       config: StepConfig) -> LayerActivations:
    scale = config.activation_scale
    # Sequence parallelism splits a block over the sequence, TP-able parts or not
    # (layer norms and dropout run sequence-parallel); TP alone splits only TP-able ones.
    sp = sequence_parallel_applies(layer, strategy)
    tp = strategy.tp if layer.tp_candidates else 1
    saved, sharded, _ = scaled_saved_bytes(layer, config)
    mode = strategy.checkpoint
    checkpointed = mode is not Checkpoint.NONE
    if mode is Checkpoint.SELECTIVE:
        kept = selective_kept_bytes(layer, tp, sp, scale)
    else:
        kept = activation_bytes(saved, sharded, layer.input_bytes * scale, tp, sp,
                                mode is Checkpoint.FULL)
    recompute, grad_share = 0.0, 1.0
    # (a loss head's backward is its measured logits copies: grad_flow below)
    if mode is Checkpoint.NONE and layer.full_backward_bytes and not logits_bytes(layer, config):
        recompute, grad_share = _plain_backward(layer, saved, sharded, tp, sp, config)
    if checkpointed:
        # The measured peak of its backward, split as the layer's saved set is.
        selective = mode is Checkpoint.SELECTIVE
        backward = measured_backward_bytes(layer, selective, config)
        grad_share = (layer.selective_backward_grad_share if selective
                      else layer.full_backward_grad_share)
        split = _tp_split(saved, sharded, tp, sp) / saved if saved else 1.0
        # That peak already holds the input's gradient where it exists by then: the
        # walk adds grad_flow_bytes (the output's and input's gradients) on top.
        recompute = max(0.0, backward * split - grad_input_bytes(layer) * scale
                        / (tp if sp else 1))
    if sp:
        # The gathered inputs are kept whole, not as the 1/t shard Megatron keeps (under
        # SELECTIVE: the all-gather's output, a collective the policy keeps).
        gathered = sp_gathered_input_bytes(layer, config)
        if mode is Checkpoint.NONE:
            kept += gathered * (1 - 1 / tp)
        elif mode is Checkpoint.SELECTIVE:
            kept += gathered
        else:
            recompute += gathered * (1 - 1 / tp)
    # Backward holds the gradient of the layer's output and produces its input's gradient.
    grad_flow = (layer.output_bytes + grad_input_bytes(layer)) * scale / (tp if sp else 1)
    logits = logits_bytes(layer, config)
    logits_grad, plain_flow = 0.0, None
    if logits:
        kept, recompute, logits = _loss_head(logits, saved, sharded, kept, recompute, tp, sp,
                                             checkpointed, config)
        # The loss head starts backward from the gradient of the log-probabilities and
        # produces the logits' gradient beside it: two logits-sized tensors (measured in
        # bench/bench_memory.py), vocabulary-parallel under TP; only then does its matmul's
        # backward make the weight gradient (none made by that peak) and its input's.
        logits_grad, plain_flow = logits / tp, grad_flow
        grad_flow = max(grad_flow, LOSS_BACKWARD_LOGITS_COPIES * logits_grad)
        if not checkpointed:
            grad_share = 0.0
    return LayerActivations(kept_bytes=kept, recompute_bytes=recompute,
                            grad_flow_bytes=grad_flow, backward_grad_share=grad_share,
                            logits_grad_bytes=logits_grad, plain_flow_bytes=plain_flow)
