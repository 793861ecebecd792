"""The bytes a training step's kernels move between one layer's forward and its next (the
reads and writes of `Layer.kernels`' records): what pushes the layer's code, Python
objects and data out of the last-level cache before its forward runs again
(`cost_models.cold_evict_probes` prices it as `Layer.forward_gap_bytes`).

Counted as `planner profile` reproduces a step around a layer
(`cost_models.layer_profile.StepNeighbours`): after the layer's forward, the layer
after's forward and backward, then its own backward; before the next, the forwards of
the layers just before it whose ops a step leaves warm (`ir.op_count
.recent_window_layers`). A step of more layers moves more between (every other layer's
passes): these are the least it moves.
"""

from __future__ import annotations

from ir.op_count import recent_window_layers


def traffic_bytes(records) -> int:
    """Bytes the kernels of `records` (`ir.kernel_records.KernelRecord`s) read and write:
    count x (parameter reads + every other read and write), per record."""
    return sum(r.count * (r.weight_bytes + r.activation_bytes) for r in records)


def forward_gap_bytes(layers: list, index: int) -> int:
    """Bytes the step's kernels move between layer `index`'s forward and its next
    (`layers`: the graph's, in step order, with kernel records; a layer without them
    counts 0): its backward, the layer after's forward and backward, and the forwards of
    the `recent_window_layers` layers before it."""
    def forward(layer) -> int:
        return traffic_bytes(layer.kernels.forward) if layer.kernels is not None else 0

    def backward(layer) -> int:
        return traffic_bytes(layer.kernels.backward) if layer.kernels is not None else 0

    previous = [layers[j].measured.forward_overloads for j in range(index - 1, -1, -1)]
    window = layers[index - recent_window_layers(previous):index]
    after = layers[index + 1:index + 2]
    return (backward(layers[index]) + sum(forward(a) + backward(a) for a in after)
            + sum(forward(b) for b in window))
