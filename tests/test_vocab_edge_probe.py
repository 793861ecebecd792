"""The vocabulary-parallel ends of a TP model (issue 17: gpt tp2+sp read the embedding at
0.65-0.7 ms of forward CPU where 0.38 was priced, and the loss-parallel cross-entropy at
1.0 ms where nothing was): the probes (`vocab_probes`), their spec fields and their price
(`tp_host.vocab_edge_seconds`, `compute.layer_compute`); and SAC's rerun of the TP
modules' DTensor work.

Hand derivation, gpt-tiny at tp 2 on 4 processes sharing 2 cores (host share 2), a TP
module figure of 1 ms, the embedding's (forward, backward) 2 and 3 ms, the loss's 5 and
7 ms:
  embedding  without its figure: 1 TP module, 1 ms / 2 x 2 = 1 ms in each pass
             with it: forward 2 x 2 = 4 ms, backward 3 x 2 = 6 ms, no TP module
             -> forward +3 ms, backward +5 ms; a recompute runs its forward again (+4 ms)
  head       its TP module as before, plus the loss: forward 5 x 2 = 10 ms, backward
             7 x 2 = 14 ms; the loss runs outside the layer's forward: no recompute
             (under SELECTIVE its TP module adds SAC's figure: 1 x 0.5 x 2 = 1 ms)
  block, SELECTIVE at tp 2, SAC's figures 0.5 ms per TP module and 2 ms per SP group:
             no SP: 6 modules x 0.5 x 2 = 6 ms more recompute than without the figures;
             SP: (2 groups x 2 + (6 - 2 x 2) modules x 0.5) x 2 = 10 ms; no checkpoint: 0
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from cost_models.compute import layer_compute
from cost_models.tp_host import selective_tp_seconds, tp_module_seconds, vocab_edge_seconds
from ir.calibration_tables import (LOSS_EDGE_FIELDS, SELECTIVE_FIELDS, VOCAB_EDGE_FIELDS,
                                   CalibrationTables, TpModuleOverhead)
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.strategy import Checkpoint, LayerStrategy
from planner.models import load_layer_graph

from cpu_specs import four_ranks_on_two_cores
from dist_utils import spawn
from test_cost_host import config

MS = 1e-3
TP = LayerStrategy(tp=2)


@pytest.fixture(scope="module")
def graph():
    return load_layer_graph("gpt-tiny", micro_batch=2, dtype=torch.float32)


def _rows(fields, forward_s, backward_s):
    return tuple(TpModuleOverhead(2, s, f) for f, s in zip(fields, (forward_s, backward_s)))


def _spec(edges: bool = True) -> ClusterSpec:
    tables = CalibrationTables(tp_modules=(TpModuleOverhead(2, 1 * MS),),
                               sp_groups=(TpModuleOverhead(2, 3 * MS, "sp_group_overhead_s"),))
    if edges:
        tables = dataclasses.replace(
            tables, vocab_embeddings=_rows(VOCAB_EDGE_FIELDS, 2 * MS, 3 * MS),
            loss_parallels=_rows(LOSS_EDGE_FIELDS, 5 * MS, 7 * MS),
            tp_selectives=_rows(SELECTIVE_FIELDS, 0.5 * MS, 2 * MS))
    return four_ranks_on_two_cores(tables)


def test_edges_price_by_hand(graph):
    embed, head = graph.layers[0], graph.layers[-1]
    assert [c.style.value for c in embed.tp_candidates] == ["vocab"]
    assert [c.style.value for c in head.tp_candidates] == ["head"]
    new, old = _spec(), _spec(edges=False)
    assert new.host_share == 2
    assert tp_module_seconds(embed, TP, new) == 0.0
    assert tp_module_seconds(embed, TP, old) == pytest.approx(2 * MS)  # 1 ms x share 2
    assert vocab_edge_seconds(embed, TP, new) == pytest.approx((4 * MS, 6 * MS, 0.0))
    assert vocab_edge_seconds(head, TP, new) == pytest.approx((10 * MS, 14 * MS, 10 * MS))
    assert vocab_edge_seconds(head, TP, old) == (0.0, 0.0, 0.0)
    assert vocab_edge_seconds(head, LayerStrategy(), new) == (0.0, 0.0, 0.0)  # tp 1
    cfg = config(graph)
    for layer, forward_s, backward_s in ((embed, 3 * MS, 5 * MS), (head, 10 * MS, 14 * MS)):
        a, b = (layer_compute(layer, TP, spec, cfg) for spec in (new, old))
        assert a.forward_s - b.forward_s == pytest.approx(forward_s)
        assert a.backward_s - b.backward_s == pytest.approx(backward_s)
    # the loss is not rerun: SELECTIVE adds only SAC's figure for the head's TP module
    # (1 x 0.5 ms x 2); the embedding's forward figure reruns, in place of a TP module's
    # forward half under FULL (4 - 1 ms), where SELECTIVE priced nothing before (4 ms)
    for mode, head_s, embed_s in ((Checkpoint.SELECTIVE, 1 * MS, 4 * MS),
                                  (Checkpoint.FULL, 0.0, 3 * MS)):
        strategy = LayerStrategy(tp=2, checkpoint=mode)
        a, b = (layer_compute(head, strategy, spec, cfg) for spec in (new, old))
        assert a.recompute_s - b.recompute_s == pytest.approx(head_s)
        a, b = (layer_compute(embed, strategy, spec, cfg) for spec in (new, old))
        assert a.recompute_s - b.recompute_s == pytest.approx(embed_s)


def test_selective_reruns_tp_modules(graph):
    block = graph.layers[1]
    assert len(block.tp_candidates) == 6
    cfg = config(graph)
    for sp, extra_s in ((False, 6 * MS), (True, 10 * MS)):
        sel = LayerStrategy(tp=2, sequence_parallel=sp, checkpoint=Checkpoint.SELECTIVE)
        assert selective_tp_seconds(block, sel, _spec()) == pytest.approx(extra_s)
        a, b = (layer_compute(block, sel, spec, cfg) for spec in (_spec(), _spec(False)))
        assert a.recompute_s - b.recompute_s == pytest.approx(extra_s)
        assert a.forward_s == pytest.approx(b.forward_s)
    assert selective_tp_seconds(block, TP, _spec()) == 0.0  # no checkpoint
    assert selective_tp_seconds(block, LayerStrategy(tp=2, checkpoint=Checkpoint.SELECTIVE),
                                _spec(False)) == 0.0  # older specs: as before


def test_edge_fields_round_trip_and_old_specs():
    spec = _spec()
    data = spec.to_dict()
    assert data["vocab_embedding_forward_overhead_s"] == {"2": 2 * MS}
    assert data["loss_parallel_backward_overhead_s"] == {"2": 7 * MS}
    assert data["sp_group_selective_overhead_s"] == {"2": 2 * MS}
    tables = ClusterSpec.from_dict(data).calibration
    assert tables.vocab_embedding_seconds(4) == (2 * MS, 3 * MS)  # the nearest size
    assert tables.loss_parallel_seconds(2) == (5 * MS, 7 * MS)
    assert tables.selective_seconds(2) == (0.5 * MS, 2 * MS)
    old = {k: v for k, v in data.items()
           if k not in (*VOCAB_EDGE_FIELDS, *LOSS_EDGE_FIELDS, *SELECTIVE_FIELDS)}
    assert ClusterSpec.from_dict(old).calibration.vocab_embedding_seconds(2) is None
    assert ClusterSpec.from_dict(old).calibration.loss_parallel_seconds(2) is None
    assert ClusterSpec.from_dict(old).calibration.selective_seconds(2) is None
    with pytest.raises(PlannerError, match=r"loss_parallel_forward_overhead_s\[2\] must map"):
        ClusterSpec.from_dict({**data, "loss_parallel_forward_overhead_s": {"2": -1.0}})
    with pytest.raises(PlannerError, match=r"vocab_embeddings holds rows of"):
        CalibrationTables(vocab_embeddings=_rows(LOSS_EDGE_FIELDS, 1.0, 1.0))
    scaled = spec.calibration.with_host_overheads_scaled(2)
    assert scaled.loss_parallel_seconds(2) == pytest.approx((10 * MS, 14 * MS))
    assert str(spec.calibration.loss_parallels[0]) == "tp2: 5.00ms/call"


def _probe_rank(rank: int, world: int, _payload) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    from cost_models.tp_probes import selective_seconds
    from cost_models.vocab_probes import (VOCAB_PROBE_ROWS_PER_RANK, VOCAB_PROBE_TOKENS,
                                          _DTensorLoss, _dtensor_embedding, _manual_embedding,
                                          _ManualLoss, loss_parallel_seconds,
                                          vocab_embedding_seconds)

    mesh = init_device_mesh("cpu", (world,))
    vocab = VOCAB_PROBE_ROWS_PER_RANK * world
    torch.manual_seed(0)  # every rank the same full logits and labels
    full = torch.randn(1, VOCAB_PROBE_TOKENS, vocab)
    labels = torch.randint(0, vocab, (1, VOCAB_PROBE_TOKENS))
    local = full.chunk(world, dim=-1)[rank].clone().requires_grad_()
    with loss_parallel():
        loss = _DTensorLoss(mesh, labels)(local)
        loss.backward()
    ids = torch.randint(0, vocab, (1, VOCAB_PROBE_TOKENS))
    shapes = [tuple(m(ids).shape) for m in (_manual_embedding(mesh), _dtensor_embedding(mesh))]
    return {"loss": loss.full_tensor().item(), "grad": local.grad,
            "manual_loss": _ManualLoss(mesh, labels)(local.detach()).item(),
            "reference": F.cross_entropy(full.view(-1, vocab), labels.view(-1)).item() / 2,
            "reference_grad": torch.autograd.functional.jacobian(
                lambda x: F.cross_entropy(x.view(-1, vocab), labels.view(-1)) / 2,
                full).chunk(world, dim=-1)[rank],
            "shapes": shapes, "embedding_s": vocab_embedding_seconds(mesh),
            "loss_s": loss_parallel_seconds(mesh), "selective_s": selective_seconds(mesh)}


def test_probes_on_two_ranks():
    """The DTensor loss computes the executor's weighted loss (the full cross-entropy over
    the split vocabulary, halved: one of two micro-batches); structure and units of the
    figures (a timing ordering would flake on this loaded host)."""
    for r in spawn(_probe_rank, 2, None, timeout_s=300):
        assert r["loss"] == pytest.approx(r["reference"], rel=1e-5)
        assert torch.allclose(r["grad"], r["reference_grad"], atol=1e-6)
        assert math.isfinite(r["manual_loss"])
        assert r["shapes"] == [(1, 4, 8), (1, 4, 8)]
        for pair in (r["embedding_s"], r["loss_s"], r["selective_s"]):
            assert len(pair) == 2 and all(math.isfinite(s) and 0.0 <= s < 1.0 for s in pair)
