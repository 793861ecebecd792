"""A float32 GEMM whose output has one row or one column (a Linear's forward or grad input
at micro-batch 1) runs MKL's matrix-vector code, whose cold call cost ~0 over the
reference here where the same Linears at m >= 4 read 2-8 us (bench/bench_gemm_cold_m.py);
`op_cold_code.op_cold_kind` prices it at the kit's GEMV_KIND, at the micro-batch being
priced, "gemm" where the kit did not measure it (older kits: as before). A pass that runs
one op on both paths (mm's grad input at m = 1 and its grad weight) pays both kinds."""

from __future__ import annotations

import dataclasses

import pytest

from ir.kernel_calibration import KernelCalibration, OpColdCodePoint
from ir.kernel_records import KernelKind, KernelRecord

from cost_models.op_cold_code import op_cold_kind, pass_cold_code_seconds
from cost_models.op_cold_probe import GEMV_KIND, GEMV_PROBE_MNK, REFERENCE_KIND, kind_calls
from tests.cpu_specs import US

# made up: the reference 2 us cold, the GEMM 7, the matrix-vector product 3
CAL = KernelCalibration(measured_on="made up for the test", op_cold_code=(
    OpColdCodePoint(REFERENCE_KIND, "float32", 2 * US), OpColdCodePoint("gemm", "float32", 7 * US),
    OpColdCodePoint(GEMV_KIND, "float32", 3 * US)))
OLD_KIT = dataclasses.replace(CAL, op_cold_code=CAL.op_cold_code[:2])


def gemm(op: str, m: int, n: int, k: int, batch: int = 1, weight_output: bool = False,
         dtype: str = "float32") -> KernelRecord:
    return KernelRecord(op, KernelKind.GEMM, dtype, (batch, m, n, k), 1, flops=2 * m * n * k,
                        weight_output=weight_output)


def forward(m: int) -> KernelRecord:
    """dlrm-small top_mlp's first Linear (26 -> 64) at micro-batch m."""
    return gemm("aten::addmm", m, 64, 26)


def test_a_one_row_or_one_column_product_pays_the_gemv_kind():
    assert op_cold_kind(forward(1), CAL) == GEMV_KIND
    assert op_cold_kind(forward(2), CAL) == op_cold_kind(forward(16), CAL) == "gemm"
    assert op_cold_kind(gemm("aten::addmm", 16, 1, 32), CAL) == GEMV_KIND  # a 1-logit head
    # the grad weight at m = 1 is an outer product (inner dim 1): MKL's GEMM code
    assert op_cold_kind(gemm("aten::mm", 64, 26, 1, weight_output=True), CAL) == "gemm"
    assert op_cold_kind(gemm("aten::bmm", 1, 32, 16, batch=4), CAL) == "gemm"
    assert op_cold_kind(gemm("aten::addmm", 1, 64, 26, dtype="bfloat16"), CAL) == "gemm"
    # at the micro-batch being priced: traced at 1 priced at 4, traced at 4 priced at 1
    assert op_cold_kind(forward(1), CAL, batch_scale=4.0) == "gemm"
    assert op_cold_kind(forward(4), CAL, batch_scale=0.25) == GEMV_KIND
    # a weight gradient's rows do not grow with the micro-batch
    assert op_cold_kind(gemm("aten::mm", 1, 32, 4, weight_output=True), CAL, 4.0) == GEMV_KIND
    assert op_cold_kind(forward(1), OLD_KIT) == "gemm"  # a kit without it: as before


def test_one_op_on_both_paths_pays_both_kinds():
    """mlp-small's Linear backward at m = 1: mm's grad input runs the gemv code, its grad
    weight the GEMM code."""
    grad_input = gemm("aten::mm", 1, 64, 64)
    grad_weight = gemm("aten::mm", 64, 64, 1, weight_output=True)
    assert pass_cold_code_seconds((grad_input, grad_weight), CAL, 0.5) == pytest.approx(
        (1 + 5) / 2 * US)
    assert pass_cold_code_seconds((grad_input, grad_weight), CAL, 0.5,
                                  batch_scale=4.0) == pytest.approx(5 / 2 * US)
    assert pass_cold_code_seconds((grad_input, grad_weight), OLD_KIT, 0.5) == pytest.approx(
        5 / 2 * US)
    assert pass_cold_code_seconds((forward(1),), CAL, 1.0) == pytest.approx(1 * US)


def test_the_gemv_probe_runs_a_one_row_product():
    m, n, k = GEMV_PROBE_MNK
    assert m == 1 and n > 1 and k > 1
    assert tuple(kind_calls()[GEMV_KIND]().shape) == (1, n)
