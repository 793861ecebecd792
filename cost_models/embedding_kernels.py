"""Embedding kernels priced by what they count, ids and rows, not bytes alone (issue 17):
an embedding's forward (a row gather), its backward (a zeroed table and a scatter-add
per index) and an embedding bag's forward and backward, each on the line the kit's
`item_probes` measured, plus the bytes of rows wider than the probes'. Called by
`cost_models.kernel_time.kernel_call_seconds` for those ops' records.

    embedding_backward_seconds(record, cluster, config, share=1.0)   # doctest: +SKIP
"""

from __future__ import annotations

import math

from ir.cluster import ClusterSpec
from ir.kernel_calibration import KernelCalibration
from ir.kernel_records import KernelRecord

from cost_models.common import StepConfig, dtype_bytes
from cost_models.item_probes import (EMBEDDING_BAG_PROBE_DIM, EMBEDDING_NARROW_PROBE_DIM,
                                     EMBEDDING_PROBE_DIM)

# An embedding's indices are int64 (torch.nn.Embedding takes LongTensor ids, as the zoo and
# HF models pass them): 8 bytes per index in an embedding backward's recorded reads.
EMBEDDING_INDEX_BYTES = 8


def streaming_seconds(cluster: ClusterSpec, kernel: str, dtype: str, nbytes: float) -> float:
    """`kernel_time.streaming_seconds` (imported when called: kernel_time imports this)."""
    from cost_models.kernel_time import streaming_seconds as streaming

    return streaming(cluster, kernel, dtype, nbytes)


def embedding_forward_seconds(r: KernelRecord, cluster: ClusterSpec, config: StepConfig,
                               share: float) -> float:
    """aten::embedding (record shape: its output, (..., dim)): the calibration's line, per
    call (the reshape, index_select and view ATen runs inside: 0.5-0.9 us here, which
    the op's count does not see) plus per index (a row gather: ~2.9 ns for 64-wide fp32
    rows here, ~1.4x their bytes at copy speed; `item_probes.probe_embedding_forward`),
    plus each index's read and write of the part of its row wider than the probe's, at
    copy bandwidth. The ids grow with the micro-batch; a TP split narrows the rows."""
    cal = cluster.kernel_calibration
    indices = math.prod(r.shape[:-1]) * config.batch_scale
    dim = r.shape[-1] * share
    wider_bytes = 2 * indices * max(0.0, dim - EMBEDDING_PROBE_DIM) * \
        config.precision.compute_bytes  # read the row, write it out
    return (cal.embedding_call_s + indices * cal.embedding_index_s
            + streaming_seconds(cluster, "copy", config.precision.compute_dtype, wider_bytes))


def embedding_probed(cal: KernelCalibration | None) -> bool:
    """Whether the kit ran profile-device's embedding probes (`item_probes`: all in one
    run). The per-index figures are slopes between two timings, floored at 0, so a loaded
    host can measure one 0; the bag's per-call figure is floored above 0 (`probe_embedding
    _bag`): a 0 slope then prices 0 per index, not all the bytes as a copy."""
    return cal is not None and (cal.embedding_backward_index_s > 0
                                or cal.embedding_bag_call_s > 0)


def embedding_backward_seconds(r: KernelRecord, cluster: ClusterSpec, config: StepConfig,
                                share: float) -> float:
    """embedding_dense_backward: a zeroed gradient table (a table-sized write, priced as a
    copy) and a scatter-add of one gradient row per index. The scatter costs per index,
    not per byte: on this CPU ~40 ns per index whether rows are 64 or 256 wide, ~8x what
    the row's bytes cost at copy bandwidth (profile-device's `embedding_backward_index_s`
    measures it), plus the rows' bytes themselves (which dominate for wide rows). The
    record reads, per index, its row and one index (`EMBEDDING_INDEX_BYTES`). Rows
    narrower than the wide probe's cost less per index (`backward_index_seconds`)."""
    dtype = config.precision.compute_dtype
    recorded_row_bytes = r.shape[-1] * dtype_bytes(r.dtype)
    indices = (r.activation_bytes / (recorded_row_bytes + EMBEDDING_INDEX_BYTES)
               * config.batch_scale * share)
    table_bytes = r.weight_bytes * config.dtype_scale * share
    row_bytes = indices * r.shape[-1] * config.precision.compute_bytes
    return (streaming_seconds(cluster, "copy", dtype, table_bytes)
            + indices * backward_index_seconds(cluster.kernel_calibration, r.shape[-1])
            + streaming_seconds(cluster, "add", dtype, row_bytes))


def backward_index_seconds(cal: KernelCalibration, dim: int) -> float:
    """An embedding backward's seconds per index at rows `dim` wide: the kit's narrow and
    wide probes' figures (`item_probes.probe_embedding_backward` at
    EMBEDDING_NARROW_PROBE_DIM and EMBEDDING_PROBE_DIM), linear in the width between
    them; the wide figure from its width on, and at every width where the narrow one was
    not measured."""
    wide_s, narrow_s = cal.embedding_backward_index_s, cal.embedding_backward_narrow_index_s
    if narrow_s <= 0 or dim >= EMBEDDING_PROBE_DIM:
        return wide_s
    # measured per-index cost at two widths (item_probes), interpolated linearly
    fraction = max(0, dim - EMBEDDING_NARROW_PROBE_DIM) / (
        EMBEDDING_PROBE_DIM - EMBEDDING_NARROW_PROBE_DIM)
    return narrow_s + fraction * (wide_s - narrow_s)


def embedding_bag_seconds(r: KernelRecord, cluster: ClusterSpec, config: StepConfig,
                           share: float, backward: bool) -> float:
    """An embedding bag's forward or backward (record shape (indices, bags, dim)): the
    calibration's line for that pass, per call plus per index (`item_probes
    .probe_embedding_bag`: a backward runs sort, cumsum, index_select, index_add_ and a
    zero-fill inside ATen, ~4x one op's dispatch at a few ids), plus what the probe's small
    table does not include: the backward's dense gradient fill of the whole table (a copy
    of its bytes) and, per index, the bytes of rows wider than the probe's. A forward of
    one bag pays `embedding_bag_multi_bag_s` less (the line is timed at several bags; ATen
    skips the bag-size slices at one). The ids and bags grow with the micro-batch; a TP
    split narrows the rows (`share`), not the ids."""
    cal = cluster.kernel_calibration
    dtype = config.precision.compute_dtype
    indices = r.shape[0] * config.batch_scale
    dim = r.shape[-1] * share
    call_s, index_s = ((cal.embedding_bag_backward_call_s, cal.embedding_bag_backward_index_s)
                       if backward else (cal.embedding_bag_call_s, cal.embedding_bag_index_s))
    if not backward and r.shape[1] * config.batch_scale <= 1:
        # item_probes.probe_embedding_bag: one bag of the few count's ids against several
        call_s = max(0.0, call_s - cal.embedding_bag_multi_bag_s)
    wider_bytes = indices * max(0.0, dim - EMBEDDING_BAG_PROBE_DIM) * \
        config.precision.compute_bytes
    fill_s = streaming_seconds(cluster, "copy", dtype, r.weight_bytes * config.dtype_scale
                                * share) if backward else 0.0
    return call_s + indices * index_s + fill_s + streaming_seconds(cluster, "add", dtype,
                                                                     wider_bytes)
