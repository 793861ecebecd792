"""Per-op-kind cold code: what a layer's pass pays beyond the host's flat per-cold-op figure
for the ops whose code the step's other work evicted, by the kernel each op runs.

The host model charges each distinct op the layers just before did not run (the window of
`ir.op_count.COLD_WINDOW_DISTINCT_OPS` distinct ops: `Layer.cold_distinct_ops_fwd`,
`cold_distinct_ops_bwd`) a flat figure (`cold_op_host_s`, `cold_backward_op_host_s`,
`cost_models.host_dispatch`), fitted on chains of small unary ops. An op with a big
kernel pays more cold: after 36 other distinct ops, nll_loss_backward ran 10-15 us over
warm, _log_softmax_backward_data 20-28, mm 13-21 (bench/bench_op_cold_code.py,
2026-11-26), 5-10x the flat figure. The kit probes each kind's cold call
(`cost_models.op_cold_probe`, `KernelCalibration.op_cold_code`) and a small unary op's
(`REFERENCE_KIND`, the flat figure's kind), so a cold op pays cold(kind) instead of the
flat figure, i.e. the excess cold(kind) - cold(reference) on top of the host's charge:

    pass seconds += (cold ops / distinct ops of the pass) x sum over the pass's distinct
                    kernel ops o of max(0, cold(kind(o)) - cold(reference))

The host counts how many of the pass's distinct ops are cold, not which (a layer after a
block finds the block's ops warm): each distinct op is charged that share of its excess.
A step whose ops all stay in the caches (`Layer.step_warm`) evicts none: 0. The code
costs per call, not per byte: no micro-batch or TP scaling (the micro-batch picks only a
float32 CPU convolution's algorithm and whether a GEMM runs MKL's matrix-vector code,
whose code it is: `op_cold_kind`). Views have no
kernel: their cold dispatch is the reference's. Kits without the table: 0 (as before). It
adds to the L2-data term (`cost_models.cold_kernel`): after both, an op read ~1 us over after the
other ops alone (bench/bench_op_cold_code.py). Not charged to a selective recompute.

A/B on the same timings (bench/bench_kernel_model.py, 180 rows, `--reprice`; rows over 15%
and median |error|, A without -> B with; 2026-11-26, one thread, shared 2-core host):
load 7-11 (table added by bench/add_op_cold_code.py) 94 -> 90, 16.0% -> 15.1%; load
12-19 77 -> 66, 12.1% -> 10.8%; load 7-8 (the kit's own table) 79 -> 71, 13.0% -> 11.8%;
each pass alone improved in every run, no row crossed from within 15% to over except
one of 180 once (dlrm top_mlp mb 4 bwd +15% -> +18%). (36 small unary ops as the other
ops, the excess was 0-1.7 us: 94 -> 94.) The rows run mostly under-priced at that load.

Convolutions: ATen runs a float32 CPU one at batch > 1 on oneDNN, a batch-1 3x3 one on
its im2col path, which is what the "conv" kind probes; oneDNN's cold call costs 3-4x
that (`op_cold_probe.ONEDNN_CONV_PROBE_SHAPE`), so those records read the oneDNN kinds
(`op_cold_kind`), in full in a forward unless the same code ran just before. A/B on the
two baselines of 2026-11-26 (13:43 and 16:41 UTC; kinds added by add_op_cold_code.py
--kinds at load 8.8): over 15% 38 -> 36 and 56 -> 53; cnn-small's stem forward at mb 4
-19% -> -3% / -28% -> -7%, at mb 16 -8% -> +3% / -18% -> -5%, blocks.0's forward at mb 4
-10% -> -1% / -9% -> +2%, at mb 16 -18% -> -14% / -19% -> -14%; no other row moved. The
backwards keep the op-name share: charged in full, the stem's went from -17% / -39% to
+1% / -15% at mb 16 but from -8% / -24% to +27% / +28% at mb 4 (its in-sequence excess
over the probe grows with the batch: not code alone).

GEMMs: MKL runs a float32 product with a one-row or one-column output on its
matrix-vector code (`runs_gemv`: a Linear's forward and grad input at micro-batch 1),
~0 over the reference cold, the kit's GEMV_KIND. A/B on the same two baselines (kind
added by add_op_cold_code.py --kinds gemv at load 1.1: gemv read 1.5 / 2.7 us, under the
reference 4.7 / 4.8): over 15% 38 -> 37 and 56 -> 56, median |error| unchanged; only
micro-batch-1 forwards moved: cnn-small's head +21% -> +15% / +33% -> +32%, dlrm-small's
bottom_mlp +44% -> +40% / +44% -> +43%, top_mlp +6% -> +4% / -1% -> -2%.
"""

from __future__ import annotations

from ir.cluster import ClusterSpec
from ir.kernel_calibration import KernelCalibration
from ir.kernel_records import KernelKind, KernelRecord
from ir.layer import Layer

from cost_models.conv_probes import runs_onednn
from cost_models.id_memo import IdMemo
from cost_models.op_cold_probe import (GEMV_KIND, ONEDNN_CONV_BACKWARD_KIND, ONEDNN_CONV_KIND,
                                       OWN_KIND_OPS, REFERENCE_KIND)

ONEDNN_CONV_KINDS = (ONEDNN_CONV_KIND, ONEDNN_CONV_BACKWARD_KIND)


def runs_gemv(r: KernelRecord, batch_scale: float = 1.0) -> bool:
    """Whether MKL runs a float32 GEMM record on its matrix-vector code at the record's
    micro-batch x `batch_scale`: one product (no batch) whose output has one row or one
    column (measured: `op_cold_probe.GEMV_PROBE_MNK`'s note). Its rows grow with the
    micro-batch unless its output is a weight gradient (`KernelRecord.weight_output`, whose
    inner dim grows: an outer product at m = 1, MKL's GEMM code, as measured)."""
    batch, m, n, _ = r.shape
    if r.dtype != "float32" or batch > 1:
        return False
    rows = m if r.weight_output else max(1, round(m * batch_scale))
    return rows == 1 or n == 1


def op_cold_kind(r: KernelRecord, cal: KernelCalibration, batch_scale: float = 1.0) -> str:
    """The kind whose cold-code point prices a record: its op's name where the kit probes
    that op apart (`op_cold_probe.OWN_KIND_OPS`: the loss), else its memory kind
    (`kernel_time.memory_kind`, as the bandwidth tables read it), else its kernel class;
    a float32 convolution that ATen runs on oneDNN at the record's batch x `batch_scale`
    (`conv_probes.runs_onednn`), the kit's oneDNN kind of its pass where measured; a GEMM
    on MKL's matrix-vector code there (`runs_gemv`), GEMV_KIND where measured."""
    from cost_models.kernel_time import memory_kind  # it imports this module's users

    op = r.op.split("::")[-1]
    if op in OWN_KIND_OPS:
        return op
    if r.kind is KernelKind.GEMM and runs_gemv(r, batch_scale) and any(
            p.kind == GEMV_KIND for p in cal.op_cold_code):
        return GEMV_KIND
    if r.kind is KernelKind.CONV and r.dtype == "float32":
        groups, batch, in_channels, _, positions, area, _ = r.shape
        kind = ONEDNN_CONV_BACKWARD_KIND if op == "convolution_backward" else ONEDNN_CONV_KIND
        if runs_onednn(groups, max(1, round(batch * batch_scale)), in_channels, positions,
                       area) and any(p.kind == kind for p in cal.op_cold_code):
            return kind
    return memory_kind(r, cal) if r.kind is KernelKind.MEMORY else r.kind.value


def cold_excess_s(cal: KernelCalibration, dtype: str) -> dict[str, float]:
    """Per measured kind of `dtype`, its cold seconds over the reference's ({} where the
    reference is unmeasured)."""
    points = {p.kind: p.seconds for p in cal.op_cold_code if p.dtype == dtype}
    if REFERENCE_KIND not in points:
        return {}
    return {kind: max(0.0, s - points[REFERENCE_KIND]) for kind, s in points.items()}


def pass_cold_code_seconds(records: tuple[KernelRecord, ...], cal: KernelCalibration,
                           cold_share: float, batch_scale: float = 1.0,
                           onednn_share: float | None = None) -> float:
    """`cold_share` x the excess of each distinct kernel op of a pass (module docstring)
    at the micro-batch `batch_scale` x the records'; a kind the kit did not probe: none.
    oneDNN convolutions' kinds at `onednn_share` instead where given."""
    excess, seen, total_s = {}, set(), 0.0
    for r in records:
        if r.kind is KernelKind.VIEW:
            continue
        kind = op_cold_kind(r, cal, batch_scale)
        # one op in two dtypes runs two kernels' code, as does one op on MKL's GEMM and
        # matrix-vector code (mm's grad weight and grad input at micro-batch 1)
        key = (r.op, r.dtype, kind == GEMV_KIND)
        if key in seen:
            continue
        seen.add(key)
        if r.dtype not in excess:
            excess[r.dtype] = cold_excess_s(cal, r.dtype)
        share = cold_share if onednn_share is None or kind not in ONEDNN_CONV_KINDS \
            else onednn_share
        total_s += share * excess[r.dtype].get(kind, 0.0)
    return total_s


def layer_cold_code_seconds(layer: Layer, cluster: ClusterSpec,
                            batch_scale: float = 1.0) -> tuple[float, float]:
    """(forward, backward) seconds a layer's passes pay for their cold ops' kernels beyond
    the host's flat figure (module docstring), at `batch_scale` x the layer's traced
    micro-batch (which convolutions run oneDNN); (0, 0) at once for a kit without the
    table (GPU presets: the search prices them without a memo lookup)."""
    cal = cluster.kernel_calibration
    if cal is None or not cal.op_cold_code or layer.kernels is None or layer.step_warm:
        return 0.0, 0.0
    return _MEMO.get((id(layer), id(cluster), batch_scale), (layer, cluster),
                     _layer_cold_code_seconds, layer, cluster, batch_scale)


# Results per (layer, cluster, micro-batch scale): the search prices a layer many times.
_MEMO = IdMemo(max_entries=4096)


def _layer_cold_code_seconds(layer: Layer, cluster: ClusterSpec,
                             batch_scale: float) -> tuple[float, float]:
    cal = cluster.kernel_calibration

    def share(cold: int, distinct: int) -> float:
        return min(1.0, cold / distinct) if distinct > 0 else 0.0

    distinct_fwd = layer.distinct_ops_fwd or len(layer.measured.forward_overloads)
    distinct_bwd = len(layer.measured.backward_overloads)
    # oneDNN runs a kernel made for each shape (its primitive cache's key): a forward's is
    # warm only after the same code (a block after a block), however many of the op names
    # the layer before ran (cnn-small's stem conv at batch 4 and 16 ran 24-33 us over its
    # probe in the profile's sequence with no op cold by name, load 3, 2026-11-26); a
    # forward placed after a backward (`Layer.forward_after_backward`) follows other code.
    warm_after_same = layer.same_code_before and not layer.forward_after_backward
    return (pass_cold_code_seconds(layer.kernels.forward, cal,
                                   share(layer.cold_distinct_ops_fwd, distinct_fwd), batch_scale,
                                   0.0 if warm_after_same else 1.0),
            pass_cold_code_seconds(layer.kernels.backward, cal,
                                   share(layer.cold_distinct_ops_bwd, distinct_bwd), batch_scale))
