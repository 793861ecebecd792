"""Small shared pieces of the cost models: units, dtype sizes, and the per-plan step config.

`StepConfig` holds what is the same for every layer of one plan (micro-batch, precision,
optimizer, the shape the layer IR was measured with), so per-layer cost functions take
`(layer, strategy, cluster, config)` and stay pure and cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ir.errors import PlannerError
from torch import nn

from ir.cluster import ClusterSpec
from ir.layer import Layer, LayerGraph
from ir.lean_host import LeanLayer, lean_layers, runs_lean_host
from ir.plan import KNOWN_OPTIMIZERS, ParallelPlan, optimizer_implementation
from ir.strategy import LayerStrategy, Precision

GiB = 2**30
MiB = 2**20
GB = 1e9  # the `*_gbps` fields count 10^9 bytes per second

# Element sizes of the dtypes the IR may be measured in.
DTYPE_BYTES = {"float64": 8, "float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1}


def dtype_bytes(name: str) -> int:
    try:
        return DTYPE_BYTES[name.removeprefix("torch.")]
    except KeyError:
        raise PlannerError(f"unknown dtype {name!r}; known: {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True, slots=True)
class StepConfig:
    """Plan-wide settings a per-layer cost needs, plus the IR's measurement shape.

    The IR's byte and FLOP figures are for `graph_micro_batch` samples in `graph_dtype`;
    `activation_scale` converts activation bytes to one micro-batch of `micro_batch`
    samples in the precision's compute dtype (linear in both); `mask_scale` does the same
    for dropout masks, which the IR measured in its dtype and CUDA keeps as bytes.
    """

    micro_batch: int
    graph_micro_batch: int
    graph_dtype: str
    precision: Precision = Precision.BF16_MIXED
    optimizer: str = "adamw"
    seq_len: int | None = None  # the IR's sequence length (attention recompute needs it)
    # Where it runs: "cuda" keeps dropout masks at 1 byte per element (fused kernel);
    # "cpu" keeps them in the activation dtype, as the IR measured them.
    device_type: str = "cuda"
    # The layer's unit on the lean host path (`ir.lean_host`: a meta-built model on a CPU
    # cluster); None: FSDP2's own path. Per layer, so `layer_configs` sets it.
    lean: LeanLayer | None = None
    # The stage runs under torch.distributed.pipelining (pp > 1): its DP units stay
    # unsharded from one backward to the next (`cost_models.dp_copies`).
    pipelined: bool = False
    # The plan's `optimizer_impl`; None: the default rule for `device_type`.
    optimizer_impl: str | None = None
    # The plan's `clip_grad_norm`: the step first clips the gradients by their global norm.
    clip_grad_norm: bool = False

    @property
    def step_implementation(self) -> str:
        """How the optimizer steps ("fused", "foreach" or "single"), as the executor runs it."""
        return optimizer_implementation(self.optimizer, self.device_type, self.optimizer_impl)

    def __post_init__(self) -> None:
        if self.micro_batch < 1 or self.graph_micro_batch < 1:
            raise PlannerError(f"micro-batch sizes must be >= 1, got {self.micro_batch} "
                               f"(plan) and {self.graph_micro_batch} (layer IR)")
        if self.optimizer not in KNOWN_OPTIMIZERS:
            raise PlannerError(f"unknown optimizer {self.optimizer!r}; use one of "
                               f"{', '.join(KNOWN_OPTIMIZERS)}")

    @property
    def batch_scale(self) -> float:
        """FLOPs and activations grow linearly with the micro-batch."""
        return self.micro_batch / self.graph_micro_batch

    @property
    def dtype_scale(self) -> float:
        return self.precision.compute_bytes / dtype_bytes(self.graph_dtype)

    @property
    def activation_scale(self) -> float:
        return self.batch_scale * self.dtype_scale

    @property
    def mask_scale(self) -> float:
        if self.device_type == "cuda":
            return self.batch_scale / dtype_bytes(self.graph_dtype)  # 1 byte per element
        return self.activation_scale

    @classmethod
    def from_plan(cls, graph: LayerGraph, plan: ParallelPlan,
                  device: str = "cuda") -> StepConfig:
        """The plan's settings with its `micro_batch` (the largest-dp layers' figure).
        `device` is the cluster's device name ("cpu" or a GPU model)."""
        return cls(micro_batch=plan.micro_batch, graph_micro_batch=graph.micro_batch,
                   graph_dtype=graph.dtype, precision=plan.precision,
                   optimizer=plan.optimizer, seq_len=graph.seq_len,
                   device_type=device_type_of(device), pipelined=plan.pp > 1,
                   optimizer_impl=plan.optimizer_impl, clip_grad_norm=plan.clip_grad_norm)


def device_type_of(device: str) -> str:
    """`StepConfig.device_type` of a cluster's device name ("cpu" or a GPU model)."""
    return "cpu" if device.lower() == "cpu" else "cuda"


def layer_configs(graph: LayerGraph, plan: ParallelPlan, device: str,
                  lean: Sequence[LeanLayer | None] | None = None) -> list[StepConfig]:
    """One StepConfig per layer: layers with a smaller DP degree see a larger micro-batch
    (global_batch / (num_microbatches * dp), `ParallelPlan.layer_micro_batch`). `lean`:
    per layer, its unit on the lean host path (`ir.lean_host.lean_layers`) or None."""
    base = StepConfig.from_plan(graph, plan, device)
    by_batch = {(base.micro_batch, None): base}
    out = []
    for j in range(len(plan.layer_strategies)):
        key = (plan.layer_micro_batch(j), None if lean is None else lean[j])
        if key not in by_batch:
            by_batch[key] = dataclasses.replace(base, micro_batch=key[0], lean=key[1])
        out.append(by_batch[key])
    return out


def lean_host_model(model: nn.Module | None, device: str) -> nn.Module | None:
    """`model` when the executor runs it on the lean host path (`ir.lean_host.runs_lean_host`:
    built on the meta device, trained on a CPU cluster), else None (FSDP2's own path, or
    no model given). The one test every pricing of a model's run makes."""
    if model is None:
        return None
    meta_built = any(p.is_meta for p in model.parameters())
    return model if runs_lean_host(meta_built, device_type_of(device)) else None


def layer_lean(model: nn.Module | None, device: str, layer: Layer,
               strategy: LayerStrategy) -> LeanLayer | None:
    """`StepConfig.lean` of one layer under `strategy` in a run of `model` on `device`
    (`lean_host_model`, then `ir.lean_host.lean_layers`): the search prices its rows so."""
    lean = lean_host_model(model, device)
    return None if lean is None else lean_layers(lean, (layer,), (strategy,))[0]


def model_layer_configs(graph: LayerGraph, plan: ParallelPlan, device: str,
                        model: nn.Module | None) -> list[StepConfig]:
    """`layer_configs` for running `model` (an nn.Module, the one the executor gets):
    a meta-built model on a CPU cluster takes the lean host path (`ir.lean_host`), whose
    units are read off the model; any other (or None) prices FSDP2's own path."""
    lean = lean_host_model(model, device)
    return layer_configs(graph, plan, device,
                         None if lean is None
                         else lean_layers(lean, graph.layers, plan.layer_strategies))


def host_figure_share(cluster: ClusterSpec) -> float:
    """The stretch of a spec's DP-unit and optimizer figures: the core share where they are
    thread CPU (`CalibrationTables.host_figures_clock`) on CPU processes, else 1 (wall
    figures of older specs already hold the sharing; GPUs)."""
    thread_cpu = cluster.calibration.host_figures_clock == "thread_cpu"
    return cluster.host_share if cluster.host_bound and thread_cpu else 1.0
