"""Model states per rank: parameters, gradients and optimizer states, under TP and ZeRO.

Bytes per parameter follow ZeRO (Rajbhandari et al. 2019, section 3.1): mixed-precision
Adam keeps 2 bytes of 16-bit weights, 2 of 16-bit gradients and K = 12 of optimizer
state (fp32 master weights, momentum, variance). Tensor parallelism divides only the
parameters the IR marks TP-able; ZeRO stage z shards optimizer states (z >= 1), gradients
(z >= 2) and parameters (z >= 3) over the layer's data-parallel group.

`model_state_bytes` is plain arithmetic: every argument may be a numpy array (one entry
per candidate strategy) and the result is then an array too, for the search.

What the executor holds (`held_bytes_per_param`, `layer_held_states`) differs from the
paper's accounting in where bytes live, not in kind. Each data-parallel layer is one
FSDP2 unit (`executors.data_parallel`: `fully_shard` for ZeRO-2/3, the FSDP2-based
`replicate` for DDP and ZeRO-1): the unit stores the model's own fp32 parameter (sharded
over DP for ZeRO-2/3, whole for `replicate`), which is also the master copy under mixed
precision (MixedPrecisionPolicy casts to the compute dtype when it gathers); the
gathered compute-dtype copy is a separate, transient tensor (memory.py times its life);
gradients are reduced and stored in fp32 (reduce_dtype). A tied weight's copy
(`Layer.tied_params`, `executors.tied.untie`) is one more parameter of its layer.

ZeRO-1 with dp > 1 is the paper's (and the Megatron distributed optimizer's,
`executors.zero1`): the layer stores its parameters and gradients in the compute dtype
(16-bit under mixed precision) and each rank keeps fp32 master weights (mixed precision
only) and moments for an even 1/dp of a flat buffer of the layer's parameters:
2 + 2 + (4 + 4m)/dp bytes per parameter mixed, 4 + 4 + 4m/dp in fp32 (m moments).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import PlannerError
from ir.layer import Layer
from ir.strategy import LayerStrategy, Precision

# Bytes one element takes.
FP32_BYTES = 4
HALF_BYTES = 2  # bf16 / fp16

# Optimizer moments kept per parameter (PyTorch: AdamW exp_avg + exp_avg_sq, SGD momentum buffer).
OPTIMIZER_MOMENTS = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0}


@dataclass(frozen=True, slots=True)
class BytesPerParam:
    """What one parameter costs in each kind of model state."""

    params: float  # weights the forward computes with
    grads: float
    optimizer: float  # fp32 master copy (mixed precision only) + moments

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def bytes_per_param(precision: Precision, optimizer: str) -> BytesPerParam:
    """ZeRO's accounting: mixed Adam 2 + 2 + 12 (K = 12), fp32 Adam 4 + 4 + 8, SGD accordingly."""
    try:
        moments = OPTIMIZER_MOMENTS[optimizer]
    except KeyError:
        raise PlannerError(f"unknown optimizer {optimizer!r}; use one of "
                           f"{', '.join(OPTIMIZER_MOMENTS)}") from None
    if precision is Precision.FP32:
        # fp32 training: the weights are the master copy, no extra fp32 copy.
        return BytesPerParam(FP32_BYTES, FP32_BYTES, moments * FP32_BYTES)
    # ZeRO section 3.1: fp16/bf16 params and grads, fp32 master + fp32 moments (K = 4 + 4m).
    return BytesPerParam(HALF_BYTES, HALF_BYTES, FP32_BYTES + moments * FP32_BYTES)


@dataclass(frozen=True, slots=True)
class ModelStates:
    """Model-state bytes one rank holds for one layer (or a sum of layers)."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer

    def __add__(self, other: ModelStates) -> ModelStates:
        return ModelStates(self.params + other.params, self.grads + other.grads,
                           self.optimizer + other.optimizer)


def tp_local_params(params, tp_params, tp):
    """Parameters one TP rank holds: TP divides only the TP-able ones (Megatron-LM)."""
    return params - tp_params + tp_params / tp


def model_state_bytes(params, tp_params, tp, dp, zero_stage,
                      per_param: BytesPerParam) -> ModelStates:
    """Per-rank bytes of parameters, gradients and optimizer states.

    ZeRO (Rajbhandari et al. 2019, Figure 1): stage >= 1 divides optimizer states by
    Nd, >= 2 also gradients, 3 also parameters. Works elementwise on numpy arrays.
    """
    local = tp_local_params(params, tp_params, tp)
    # dp ** (condition) is dp where the stage shards that state and 1 where it does not.
    opt_shards = dp ** (zero_stage >= 1)
    grad_shards = dp ** (zero_stage >= 2)
    param_shards = dp ** (zero_stage >= 3)
    return ModelStates(params=local * per_param.params / param_shards,
                       grads=local * per_param.grads / grad_shards,
                       optimizer=local * per_param.optimizer / opt_shards)


@dataclass(frozen=True, slots=True)
class HeldBytesPerParam:
    """Bytes per parameter the executor keeps, by role (torch FSDP2 MixedPrecisionPolicy:
    sharded parameters keep their dtype, `param_dtype` for the gathered copy and the
    gradient autograd computes, `reduce_dtype` for the reduction and the stored gradient)."""

    weights: float  # the stored parameter (fp32: the model is built in fp32)
    working: float  # the gathered compute-dtype copy of a DP unit, while it is gathered
    grads: float  # the stored gradient (a DP unit's reduced gradient)
    unsharded_grads: float  # autograd's gradient of the working copy, before reduction
    reduce: float  # a DP unit's reduction buffers and gradients accumulated unreduced
    moments: float  # optimizer moments


def held_bytes_per_param(precision: Precision, optimizer: str) -> HeldBytesPerParam:
    """What the executor holds per parameter (module docstring): fp32 weights, gradients
    and moments, plus the compute-dtype working copy and gradient of a DP unit."""
    moments = bytes_per_param(Precision.FP32, optimizer).optimizer  # fp32 moments
    compute = FP32_BYTES if precision is Precision.FP32 else HALF_BYTES
    return HeldBytesPerParam(weights=FP32_BYTES, working=compute, grads=FP32_BYTES,
                             unsharded_grads=compute, reduce=FP32_BYTES, moments=moments)


def has_dp_unit(layer: Layer, strategy: LayerStrategy, precision: Precision) -> bool:
    """Whether the executor makes the layer an FSDP2 unit (`executors.data_parallel.
    needs_dp_unit`: it holds parameters and runs data parallel or in mixed precision)."""
    return layer.params + layer.tied_params > 0 and (
        strategy.dp > 1 or precision is not Precision.FP32)


def held_local_params(layer: Layer, strategy: LayerStrategy) -> float:
    """Parameters one TP rank of the layer holds, its tied copies included."""
    return tp_local_params(layer.params + layer.tied_params,
                           layer.tp_params + layer.tied_tp_params, strategy.tp)


def zero1_flat(strategy: LayerStrategy) -> bool:
    """Whether the executor runs the layer as ZeRO-1's flat-buffer shards (`executors.zero1`)."""
    return strategy.dp_mode.stage == 1 and strategy.dp > 1


def layer_held_states(layer: Layer, strategy: LayerStrategy,
                      held: HeldBytesPerParam) -> ModelStates:
    """Bytes the executor keeps for the whole step (module docstring): stored weights and
    gradients sharded over DP by ZeRO-2/3 (`fully_shard`, every tensor split evenly),
    moments too; ZeRO-1 (`zero1_flat`) stores weights and gradients in the compute dtype
    and shards fp32 master weights (mixed precision) and moments evenly over DP."""
    local = held_local_params(layer, strategy)
    if zero1_flat(strategy):
        # Rajbhandari et al. 2019, sec. 5.1 (P_os): 2Ψ + 2Ψ + KΨ/Nd, K = 4 (master) + 4m.
        master = FP32_BYTES if held.working != FP32_BYTES else 0.0
        return ModelStates(params=local * held.working, grads=local * held.working,
                           optimizer=local * (master + held.moments) / strategy.dp)
    stage = strategy.dp_mode.stage
    shards = strategy.dp if stage >= 2 else 1
    return ModelStates(params=local * held.weights / shards, grads=local * held.grads / shards,
                       optimizer=moment_params(layer, strategy) * held.moments)


def moment_params(layer: Layer, strategy: LayerStrategy) -> float:
    """Parameters whose optimizer moments one rank keeps (every rank alike)."""
    return max(moment_shares(layer, strategy))


def moment_shares(layer: Layer, strategy: LayerStrategy) -> list[float]:
    """Parameters whose moments each rank of the layer's DP group keeps: an even 1/dp
    under ZeRO-1/2/3 (a flat buffer split evenly; FSDP2 splits every tensor), all of them
    otherwise. One entry: every rank alike (the padding of the last shard is < dp
    elements)."""
    stage = strategy.dp_mode.stage
    return [held_local_params(layer, strategy) / (strategy.dp if stage >= 1 else 1)]


def zero1_step_bytes(layer: Layer, strategy: LayerStrategy,
                     held: HeldBytesPerParam) -> tuple[float, float]:
    """ZeRO-1's step temporaries of one layer (`executors.zero1.FlatShardGroup`):
    (the fp32 gradient shard of the master weights, alive during the optimizer step:
    mixed precision only, fp32 steps on views of the gradient; the all-gather's send
    shard and receive buffer, one layer at a time, in the parameters' dtype)."""
    if not zero1_flat(strategy):
        return 0.0, 0.0
    local = held_local_params(layer, strategy)
    master_grad = local / strategy.dp * FP32_BYTES if held.working != FP32_BYTES else 0.0
    return master_grad, local * (1 + 1 / strategy.dp) * held.working


def largest_param_tensor(layer: Layer) -> int:
    """Elements in the layer's largest parameter tensor, as far as the IR tells.

    The IR lists the TP-able modules with their parameter counts (one weight matrix or
    embedding table each); elsewhere the whole layer is the bound. The IR's
    `max_param_numel` (when recorded) is exact.
    """
    if layer.max_param_numel:
        return layer.max_param_numel
    if layer.tp_candidates:
        biggest = max(c.params for c in layer.tp_candidates)
        rest = layer.params - sum(c.params for c in layer.tp_candidates)
        return max(biggest, rest, layer.tied_params)
    return max(layer.params, layer.tied_params)
