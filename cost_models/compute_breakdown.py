"""Where an estimate's compute time goes, by kernel class, on its critical pipeline rank.

    compute_by_class(graph, plan, cluster, est.pipeline.critical_rank) -> ComputeByClass

The estimate's compute line (m micro-batches of forward, backward and recomputation on
the critical rank) split into the kernel model's classes: GEMMs, fused attention,
memory-bound kernels (norms, softmax, activations, dropout, residual adds, casts), and
what each pass costs beyond its kernels (host dispatch the device did not hide, launch
floors, dropout draws, DP-unit and TP-module framework time), with recomputation
(checkpointing) and a GPU step's gradient accumulation (`cost_models.grad_accumulation`)
on lines of their own. The classes are the kernel model's own sums
(`cost_models.kernel_time.layer_kernel_seconds`) and the totals `layer_compute`'s, so the
parts add up to the estimate's compute exactly. A layer without kernel records, or one a
measured profile prices, counts whole under `other_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.layer import LayerGraph
from ir.plan import ParallelPlan

from cost_models.common import layer_configs
from cost_models.compute import layer_compute, tp_compute_fraction
from cost_models.compute_profile import ComputeProfile
from cost_models.grad_accumulation import accumulation_step_seconds
from cost_models.kernel_time import layer_kernel_seconds
from cost_models.memory import rank_layers


@dataclass(frozen=True, slots=True)
class ComputeByClass:
    """Seconds per iteration on one pipeline rank (all its micro-batches)."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    memory_s: float = 0.0
    overhead_s: float = 0.0  # host, launch floors, draws, framework: beyond the kernels
    recompute_s: float = 0.0
    other_s: float = 0.0  # layers priced without kernel records or from a profile
    accumulation_s: float = 0.0  # GPUs: the gradients' fp32 cast and sums (grad_accumulation)

    @property
    def total_s(self) -> float:
        return (self.gemm_s + self.attention_s + self.memory_s + self.overhead_s
                + self.recompute_s + self.other_s + self.accumulation_s)

    def rows(self) -> tuple[tuple[str, float], ...]:
        return (("GEMMs", self.gemm_s), ("attention kernels", self.attention_s),
                ("memory-bound kernels", self.memory_s),
                ("host, launch, framework", self.overhead_s),
                ("recomputation", self.recompute_s), ("gradient accumulation", self.accumulation_s),
                ("other layers", self.other_s))

    def to_json(self) -> dict[str, float]:
        return {"gemm": self.gemm_s, "attention": self.attention_s, "memory": self.memory_s,
                "overhead": self.overhead_s, "recompute": self.recompute_s,
                "other": self.other_s, "accumulation": self.accumulation_s}


def compute_by_class(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec, rank: int,
                     profile: ComputeProfile | None = None) -> ComputeByClass:
    """The compute of pipeline rank `rank` per iteration, by kernel class."""
    configs = layer_configs(graph, plan, cluster.device)
    gemm = attention = memory = overhead = recompute = other = accumulation = 0.0
    m = plan.num_microbatches
    for j in rank_layers(plan)[rank]:
        layer, strategy, config = graph.layers[j], plan.layer_strategies[j], configs[j]
        c = layer_compute(layer, strategy, cluster, config, profile)
        recompute += c.recompute_s
        accumulation += accumulation_step_seconds(layer, strategy, cluster, config, m)
        measured = profile is not None and profile.lookup(layer) is not None
        if layer.kernels is None or measured:
            other += c.forward_s + c.backward_s
            continue
        k = layer_kernel_seconds(layer.kernels, cluster, config,
                                 tp_compute_fraction(layer, strategy))
        kernels_s = 0.0
        for seconds in (k.forward, k.backward):
            gemm += seconds.gemm_s
            attention += seconds.attention_s
            memory += seconds.memory_s
            kernels_s += seconds.gemm_s + seconds.attention_s + seconds.memory_s
        overhead += c.forward_s + c.backward_s - kernels_s
    return ComputeByClass(m * gemm, m * attention, m * memory, m * overhead, m * recompute,
                          m * other, accumulation)
