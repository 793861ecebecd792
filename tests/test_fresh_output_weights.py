"""The fresh-output term (`cost_models.fresh_output`): a weight gradient's output is
weight-sized at every micro-batch (the recorder marks it, `KernelRecord.weight_output`; only
token-shaped outputs grow), each figure worked out by hand from a real nn.Linear traced on
meta, bias included; the probe's pool is twice the last-level cache sysfs lists, and the
spec records it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_records import KernelKind
from ir.measure import build_layer_graph
from ir.strategy import Precision

from cost_models.common import StepConfig
from cost_models.fresh_output import (FALLBACK_LAST_LEVEL_CACHE_BYTES, FRESH_OUTPUT_BYTES,
                                      fresh_pool_bytes, last_level_cache_bytes, output_bytes,
                                      probe_fresh_output)
from cost_models.kernel_time import pass_seconds
from tests.test_kernel_sequence import BASE, spec

FLOAT = 4  # fp32 bytes


class _OneLinear(nn.Module):
    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.fc = nn.Linear(features_in, features_out)

    def forward(self, x):
        return self.fc(x)


def linear_records(features_in: int, features_out: int, rows: int):
    """The Linear's own backward kernels (mm, mm, the bias's sum; the loss's left out),
    traced on `rows` x `features_in` inputs (no sequence: the IR's tokens are `rows`)."""
    with torch.device("meta"):
        model = _OneLinear(features_in, features_out)
        # x requires grad, as an activation does: dy @ W is made (a data input's is not)
        x = torch.empty(rows, features_in, requires_grad=True)
        target = torch.empty(rows, features_out)
    graph = build_layer_graph(model, {"x": x}, target, lambda out, t: ((out - t) ** 2).mean(),
                              seq_len=None)
    (layer,) = graph.layers
    return layer.kernels.forward, tuple(
        r for r in layer.kernels.backward if r.op in ("aten::mm", "aten::sum"))


def config(micro_batch: int, graph_micro_batch: int) -> StepConfig:
    return StepConfig(micro_batch=micro_batch, graph_micro_batch=graph_micro_batch,
                      graph_dtype="float32", precision=Precision.FP32, seq_len=None,
                      device_type="cpu")


def _outputs(records, cfg, backward=True) -> list[tuple[str, float]]:
    return sorted((r.op, output_bytes(r, cfg, 1.0, backward)) for r in records)


def test_a_linear_traced_at_one_row_keeps_its_bias_gradient_at_sixteen():
    """Linear(32 -> 64) traced on one row; backward: dy @ W (1 x 32 out), x^T @ dy
    (64 x 32: the weight's gradient), the bias's sum (64). At micro-batch 16 the first
    grows to 16 x 32; the weight's and the bias's gradients stay 64 x 32 and 64 floats
    (the old price grew the bias's 16-fold: a sum over the tokens is weight-sized)."""
    _, backward = linear_records(32, 64, rows=1)
    assert _outputs(backward, config(1, 1)) == [
        ("aten::mm", 1 * 32 * FLOAT), ("aten::mm", 64 * 32 * FLOAT),
        ("aten::sum", 64 * FLOAT)]
    assert _outputs(backward, config(16, 1)) == [
        ("aten::mm", 16 * 32 * FLOAT), ("aten::mm", 64 * 32 * FLOAT),
        ("aten::sum", 64 * FLOAT)]


def test_a_weight_gradient_whose_rows_equal_the_tokens_is_told_by_what_it_reads():
    """Linear(16 -> 16) traced on 16 rows: dy @ W and x^T @ dy are both (1, 16, 16, 16)
    products (m = the tokens in both), told apart only by what they read (dy @ W reads
    the weight). Priced at micro-batch 1: dy @ W writes 1 x 16, x^T @ dy still 16 x 16, the
    bias's sum 16 floats; forward x @ W^T writes 1 x 16. (Dims alone scaled the weight's
    gradient down to 1 x 16, as a token-shaped product.)"""
    forward, backward = linear_records(16, 16, rows=16)
    assert _outputs(backward, config(1, 16)) == [
        ("aten::mm", 1 * 16 * FLOAT), ("aten::mm", 16 * 16 * FLOAT),
        ("aten::sum", 16 * FLOAT)]
    addmm = [r for r in forward if r.op == "aten::addmm"]
    assert _outputs(addmm, config(1, 16), backward=False) == [
        ("aten::addmm", 1 * 16 * FLOAT)]


def test_the_backward_pass_pays_the_weight_sized_outputs_at_the_measured_rate():
    """One fresh-output point (8 KiB at 10 GB/s: the rate at every size). Linear(32 -> 64)
    at micro-batch 16, traced on one row: (16 x 32 + 64 x 32 + 64) floats = 10,496 bytes
    of fresh outputs backward, 10,496 / 10e9 s on top of the same kit without the point."""
    _, backward = linear_records(32, 64, rows=1)
    fresh = spec(dataclasses.replace(BASE, memory_kernels=BASE.memory_kernels + (
        MemoryKernelPoint("fresh_output", "float32", 8 * 2**10, 10.0),)))
    cfg = config(16, 1)
    added = (pass_seconds(backward, fresh, cfg, 1.0, backward=True).total_s
             - pass_seconds(backward, spec(BASE), cfg, 1.0, backward=True).total_s)
    assert added == pytest.approx((16 * 32 + 64 * 32 + 64) * FLOAT / 10e9)
    assert all(r.kind in (KernelKind.GEMM, KernelKind.MEMORY) for r in backward)


def _cache(tmp_path, *caches):
    """A sysfs cache folder: one index<N> per (level, type, size)."""
    for i, (level, kind, size) in enumerate(caches):
        index = tmp_path / f"index{i}"
        index.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (index / name).write_text(f"{value}\n")
    return str(tmp_path)


def test_the_pool_is_twice_the_last_level_cache_sysfs_lists(tmp_path):
    # this CPU's layout (48K L1d, 32K L1i, 1024K L2, 32768K L3): the L3, 32 MiB; a 2M L2
    # as the last level: 2 MiB; an instruction cache is never the last level
    here = _cache(tmp_path / "a", (1, "Data", "48K"), (1, "Instruction", "32K"),
                  (2, "Unified", "1024K"), (3, "Unified", "32768K"))
    assert last_level_cache_bytes(here) == 32 * 2**20
    assert fresh_pool_bytes(here) == 64 * 2**20
    two = _cache(tmp_path / "b", (1, "Data", "32K"), (2, "Unified", "2M"),
                 (3, "Instruction", "64M"))
    assert last_level_cache_bytes(two) == 2 * 2**20
    # nothing readable (no /sys in a container): the named fallback
    assert last_level_cache_bytes(str(tmp_path / "missing")) == FALLBACK_LAST_LEVEL_CACHE_BYTES
    assert last_level_cache_bytes() > 0  # this machine's own sysfs, or the fallback


def test_the_probe_rotates_over_the_pool_it_is_given_and_prices_the_difference(monkeypatch):
    """A stand-in for `seconds_per_call` that runs the timed call over 64 turns and reads
    1 us per distinct block written: the hot call writes one block (1 us), a fresh call
    one of pool_bytes / size blocks (at least two). With a 256 KiB pool: 8 KiB writes
    into 32 blocks (31 us more: 8192 / 31e-6 / 1e9 GB/s), 32 KiB into 8, 128 KiB into 2,
    and every larger size into 2 (1 us more). One round: the stand-in reads the same
    every round (the 3 of the kit only re-ran the 8 MiB adds)."""
    from cost_models import fresh_output

    monkeypatch.setattr(fresh_output, "FRESH_PROBE_ROUNDS", 1)

    def seconds_per_call(call, device):
        return 1e-6 * len({call(i).data_ptr() for i in range(64)})

    points = probe_fresh_output("cpu", seconds_per_call, 256 * 2**10)
    blocks = {8 * 2**10: 32, 32 * 2**10: 8}
    assert [(p.kernel, p.nbytes) for p in points] == [("fresh_output", n)
                                                      for n in FRESH_OUTPUT_BYTES]
    for p in points:
        assert p.gbps == pytest.approx(p.nbytes / ((blocks.get(p.nbytes, 2) - 1) * 1e-6) / 1e9)


def test_the_spec_records_the_pool_and_reads_it_back():
    cal = dataclasses.replace(BASE, fresh_output_pool_bytes=64 * 2**20)
    again = KernelCalibration.from_dict(cal.to_dict())
    assert again.fresh_output_pool_bytes == 64 * 2**20
    assert KernelCalibration.from_dict(BASE.to_dict()).fresh_output_pool_bytes == 0  # older
