"""SAC on a whole TP+SP block (`cost_models.block_probes`): its spec field, its price
(`tp_host.selective_tp_seconds`), and the probe's block split as the executor splits one.

Hand derivation, gpt-tiny block at tp 2 on 4 processes sharing 2 cores (host share 2),
SAC's Linear-pair figures 0.5 ms per TP module and 2 ms per SP group, the whole-block
figure 4 ms per SP group, 1 ms of it in the forward:
  SP, SELECTIVE   2 groups x 4 ms x 2 = 16 ms (the block figure holds k and v: the 2
                  modules outside the groups add nothing), its forward 2 x 1 x 2 = 4 ms;
                  without the block figure, as before: (2 x 2 + 2 x 0.5) x 2 = 10 ms,
                  all in the recompute -> forward +4 ms, recompute 12 - 10 = +2 ms
  TP, SELECTIVE   no groups: 6 modules x 0.5 x 2 = 6 ms, the block figure unused
  no checkpoint   0
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from cost_models.compute import layer_compute
from cost_models.tp_host import selective_tp_forward_seconds, selective_tp_seconds
from ir.calibration_tables import (SELECTIVE_FIELDS, SP_BLOCK_SELECTIVE_FIELDS,
                                   CalibrationTables, TpModuleOverhead)
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.strategy import Checkpoint, LayerStrategy
from planner.models import load_layer_graph

from cpu_specs import four_ranks_on_two_cores
from dist_utils import spawn
from test_cost_host import config

MS = 1e-3


@pytest.fixture(scope="module")
def graph():
    return load_layer_graph("gpt-tiny", micro_batch=2, dtype=torch.float32)


def _spec(block: bool = True) -> ClusterSpec:
    tables = CalibrationTables(
        tp_modules=(TpModuleOverhead(2, 1 * MS),),
        sp_groups=(TpModuleOverhead(2, 3 * MS, "sp_group_overhead_s"),),
        tp_selectives=tuple(TpModuleOverhead(2, s, f)
                            for f, s in zip(SELECTIVE_FIELDS, (0.5 * MS, 2 * MS))))
    if block:
        tables = dataclasses.replace(tables, sp_block_selectives=tuple(
            TpModuleOverhead(2, s, f)
            for f, s in zip(SP_BLOCK_SELECTIVE_FIELDS, (4 * MS, 1 * MS))))
    return four_ranks_on_two_cores(tables)


def test_block_figure_prices_by_hand(graph):
    block, cfg = graph.layers[1], config(graph)
    sp_sel = LayerStrategy(tp=2, sequence_parallel=True, checkpoint=Checkpoint.SELECTIVE)
    tp_sel = LayerStrategy(tp=2, checkpoint=Checkpoint.SELECTIVE)
    assert selective_tp_seconds(block, sp_sel, _spec()) == pytest.approx(16 * MS)
    assert selective_tp_forward_seconds(block, sp_sel, _spec()) == pytest.approx(4 * MS)
    assert selective_tp_forward_seconds(block, sp_sel, _spec(False)) == 0.0
    assert selective_tp_forward_seconds(block, tp_sel, _spec()) == 0.0
    assert selective_tp_seconds(block, sp_sel, _spec(False)) == pytest.approx(10 * MS)
    assert selective_tp_seconds(block, tp_sel, _spec()) == pytest.approx(6 * MS)
    assert selective_tp_seconds(block, LayerStrategy(tp=2, sequence_parallel=True),
                                _spec()) == 0.0
    a, b = (layer_compute(block, sp_sel, spec, cfg) for spec in (_spec(), _spec(False)))
    assert a.forward_s - b.forward_s == pytest.approx(4 * MS)
    assert a.recompute_s - b.recompute_s == pytest.approx(2 * MS)


def test_block_field_round_trip_and_old_specs():
    data = _spec().to_dict()
    total, forward = SP_BLOCK_SELECTIVE_FIELDS
    assert data[total] == {"2": 4 * MS} and data[forward] == {"2": 1 * MS}
    tables = ClusterSpec.from_dict(data).calibration
    assert tables.sp_block_selective_seconds(4) == (4 * MS, 1 * MS)  # the nearest size
    old = {k: v for k, v in data.items() if k not in SP_BLOCK_SELECTIVE_FIELDS}
    assert ClusterSpec.from_dict(old).calibration.sp_block_selective_seconds(2) is None
    assert ClusterSpec.from_dict(old).to_dict() == _spec(False).to_dict()
    with pytest.raises(PlannerError, match=r"sp_block_selective_overhead_s\[2\] must map"):
        ClusterSpec.from_dict({**data, total: {"2": -1.0}})
    with pytest.raises(PlannerError, match=r"sp_block_selective_forward_overhead_s.*not a TP"):
        ClusterSpec.from_dict({**data, forward: {"two": 1.0}})
    with pytest.raises(PlannerError, match=r"sp_block_selectives holds rows of"):
        CalibrationTables(sp_block_selectives=(TpModuleOverhead(2, MS, "tp_module_overhead_s"),))
    scaled = _spec().calibration.with_host_overheads_scaled(2)
    assert scaled.sp_block_selective_seconds(2) == pytest.approx((8 * MS, 2 * MS))


def _probe_rank(rank: int, world: int, _payload) -> dict:
    """The probe's split block against the same weights unsplit (dropout off, so both
    compute the same function), and the figure."""
    from torch.distributed.device_mesh import init_device_mesh

    from cost_models.block_probes import (SP_BLOCK_HEAD_WIDTH, SP_BLOCK_HEADS_PER_RANK,
                                          _Block, _sp_block, sp_block_selective_seconds)
    from cost_models.tp_probes import SP_PROBE_LOCAL_TOKENS

    mesh = init_device_mesh("cpu", (world,))
    width = SP_BLOCK_HEAD_WIDTH * SP_BLOCK_HEADS_PER_RANK * world
    torch.manual_seed(0)
    plain = _Block(width, world).eval()
    torch.manual_seed(0)  # the same full weights: each rank keeps its shard of them
    split = _sp_block(mesh, width).eval()
    x = torch.randn(1, SP_PROBE_LOCAL_TOKENS * world, width)  # (batch, sequence, width)
    expected = plain(x).chunk(world, dim=1)[rank]
    got = split(x.chunk(world, dim=1)[rank].clone())
    return {"error": (got - expected).abs().max().item(), "shape": tuple(got.shape),
            "seconds": sp_block_selective_seconds(mesh)}


def test_probe_block_is_the_sp_split_of_the_plain_one():
    """Structure and units of the figure (a timing ordering would flake on this host)."""
    from cost_models.block_probes import SP_BLOCK_HEAD_WIDTH, SP_BLOCK_HEADS_PER_RANK
    from cost_models.tp_probes import SP_PROBE_LOCAL_TOKENS

    for r in spawn(_probe_rank, 2, None, timeout_s=300):
        assert r["error"] < 1e-5
        assert r["shape"] == (1, SP_PROBE_LOCAL_TOKENS, 2 * SP_BLOCK_HEAD_WIDTH
                              * SP_BLOCK_HEADS_PER_RANK)
        both_s, forward_s = r["seconds"]
        assert all(math.isfinite(s) for s in r["seconds"])
        assert 0.0 <= forward_s <= both_s < 1.0
