"""Plan JSON 'planner.plan/v1': round trip, mesh layout, and every kind of bad file."""

from __future__ import annotations

import errno
import os

import dataclasses
import json

import pytest

from ir.errors import PlannerError
from ir.plan import (PlanDocument, layer_groups, load_plan, model_identity, pipeline_groups,
                     plan_from_dict, plan_to_dict, save_plan, uniform_plan)
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Schedule
from planner.models import load_layer_graph

NAMES = tuple(f"l{i}" for i in range(6))


def _doc(**kw) -> PlanDocument:
    plan = uniform_plan(6, tp=2, dp=2, pp=2, zero=3, checkpoint=Checkpoint.FULL, micro_batch=2,
                        global_batch=16, **kw)
    return PlanDocument(plan, "gpt-tiny", "abc123", NAMES, {"name": "local"},
                        {"iteration_seconds": 1.5}, {"seconds": 0.1})


def test_round_trip(tmp_path):
    doc = _doc()
    path = tmp_path / "plan.json"
    save_plan(doc, path)
    back = load_plan(path)
    assert back == doc
    assert plan_to_dict(back) == plan_to_dict(doc)


def test_mesh_layout_tp_innermost():
    plan = _doc().plan
    assert plan.world_size == 8 and plan.stage_ranks(1) == (4, 5, 6, 7)
    groups = layer_groups(plan, 4)  # a stage-1 layer: tp=2, dp=2 over ranks 4..7
    assert groups.tp_groups == ((4, 5), (6, 7))
    assert groups.dp_groups == ((4, 6), (5, 7))
    assert pipeline_groups(plan) == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_interleaved_stage_ranks():
    plan = uniform_plan(8, pp=2, virtual_stages=2, schedule=Schedule.INTERLEAVED,
                        micro_batch=1, global_batch=4)
    assert len(plan.stages) == 4 and plan.pp == 2 and plan.world_size == 2
    assert [plan.stage_ranks(i) for i in range(4)] == [(0,), (1,), (0,), (1,)]


def _dumped(tmp_path, mutate) -> str:
    data = plan_to_dict(_doc())
    mutate(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return str(path)


BAD_FILES = [
    ("unknown schema", lambda d: d.update(schema="planner.plan/v9"), "unknown schema version"),
    ("missing key", lambda d: d.pop("micro_batch"), "micro_batch: missing"),
    ("wrong type", lambda d: d["layers"][2].update(tp="two"), "layers[2].tp: expected an integer"),
    ("bad enum", lambda d: d["layers"][0].update(dp_mode="zero4"), "layers[0].dp_mode: 'zero4' is not one of"),
    ("world size", lambda d: d.update(world_size=16), "world_size: 16 but the stages use 8"),
    ("layer count", lambda d: d["layers"].pop(), "5 entries but model.num_layers is 6"),
    ("batch", lambda d: d.update(global_batch=10), "global batch 10"),
    ("devices", lambda d: d["layers"][0].update(dp=1), "tp=2 x dp=1 = 2 but stage 0 has 4"),
]


@pytest.mark.parametrize("name,mutate,message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_plan_files_name_the_problem(tmp_path, name, mutate, message):
    path = _dumped(tmp_path, mutate)
    with pytest.raises(PlannerError) as info:
        load_plan(path)
    assert message in str(info.value) and path in str(info.value)
    assert "\n" not in str(info.value)


def test_truncated_malformed_and_missing_files(tmp_path):
    good = json.dumps(plan_to_dict(_doc()))
    truncated = tmp_path / "t.json"
    truncated.write_text(good[: len(good) // 2])
    with pytest.raises(PlannerError, match="truncated JSON"):
        load_plan(truncated)
    malformed = tmp_path / "m.json"
    malformed.write_text("{'schema': 1}")
    with pytest.raises(PlannerError, match="malformed JSON"):
        load_plan(malformed)
    with pytest.raises(PlannerError, match="does not exist"):
        load_plan(tmp_path / "nope.json")
    with pytest.raises(PlannerError, match="expected a JSON object"):
        plan_from_dict([1, 2], "x.json")


SMALL_GPT = "gpt:layers=2,hidden=32,heads=2,vocab=64,seq=8"


def _doc_for(graph, spec=None) -> PlanDocument:
    plan = uniform_plan(len(graph.layers), dp=2, micro_batch=graph.micro_batch)
    return PlanDocument(plan, graph.model, cluster={"name": "local"}, model_spec=spec,
                        **model_identity(graph))


def test_plan_records_spec_and_layer_digests(tmp_path):
    graph = load_layer_graph(SMALL_GPT)
    doc = _doc_for(graph, SMALL_GPT)
    save_plan(doc, tmp_path / "p.json")
    back = load_plan(tmp_path / "p.json")
    assert back == doc and back.model_spec == SMALL_GPT
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["model"]["spec"] == SMALL_GPT
    assert [l["params"] for l in data["layers"]] == [l.params for l in graph.layers]
    assert len({l["digest"] for l in data["layers"]}) >= 3  # embedding, block, head differ
    back.check_model(graph)  # the same model passes


def test_fingerprint_mismatch_names_the_first_layer_that_differs():
    doc = _doc_for(load_layer_graph(SMALL_GPT))
    wider_mlp = load_layer_graph(SMALL_GPT.replace("layers=2", "layers=2,ffn=64"))
    with pytest.raises(PlannerError) as info:
        doc.check_model(wider_mlp)
    first_block = next(l for l in wider_mlp.layers if l.kind == "Block")
    message = str(info.value)
    assert f"differs first at layer {first_block.index} ({first_block.name}, Block)" in message
    assert f"{first_block.params:,} parameters here" in message and "\n" not in message
    more_heads = load_layer_graph(SMALL_GPT.replace("heads=2", "heads=4"))  # same parameters
    with pytest.raises(PlannerError, match=r"differs first at layer 1 \(blocks.0, Block\): same "
                                           r"parameter count but other .* head counts"):
        doc.check_model(more_heads)
    deeper = load_layer_graph(SMALL_GPT.replace("layers=2", "layers=3"))
    with pytest.raises(PlannerError, match=r"differs first at layer 3: 'blocks.2' here"):
        doc.check_model(deeper)
    with pytest.raises(PlannerError, match=r"traced at micro-batch 2, sequence 8, bfloat16 and "
                                           r"the plan at micro-batch 1, sequence 8, bfloat16"):
        doc.check_model(load_layer_graph(SMALL_GPT, micro_batch=2))


def test_edited_fingerprint_and_world_size_checks():
    graph = load_layer_graph(SMALL_GPT)
    doc = dataclasses.replace(_doc_for(graph), fingerprint="abc123")
    with pytest.raises(PlannerError, match="fingerprint abc123.*matches the plan layer by layer"):
        doc.check_model(graph)
    legacy = dataclasses.replace(doc, layer_digests=(), layer_params=())
    with pytest.raises(PlannerError, match="records no per-layer digests"):
        legacy.check_model(graph)
    with pytest.raises(PlannerError, match="plan needs 8 processes but the job has 4"):
        _doc().check_world_size(4)


def test_digests_are_all_or_none():
    data = plan_to_dict(_doc_for(load_layer_graph(SMALL_GPT)))
    del data["layers"][1]["digest"]
    with pytest.raises(PlannerError, match="layers: 4 of 5 layers have a digest: all or none"):
        plan_from_dict(data, "p.json")


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    """The rename fails after the temporary file is written: the old plan stays and the
    temporary file is gone (the failure is where a full disk or a lost mount hits)."""
    path = tmp_path / "plan.json"
    path.write_text("precious")
    import ir.output_file as output_file

    temporary = []

    def broken(src, dst):
        temporary.append(src)
        assert os.path.exists(src)  # the failure comes after the temporary file exists
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(output_file.os, "replace", broken)
    with pytest.raises(PlannerError, match="the previous file .* is unchanged"):
        save_plan(_doc(), path)
    assert temporary and path.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_plan_invariants():
    s = LayerStrategy(tp=2, dp=2, dp_mode=DPMode.ZERO1)
    assert str(s) == "tp2·dp2·z1"
    with pytest.raises(ValueError, match="sequence_parallel needs tp > 1"):
        LayerStrategy(sequence_parallel=True)
    with pytest.raises(PlannerError, match="equal device counts"):
        from ir.plan import ParallelPlan
        from ir.strategy import Stage
        ParallelPlan(stages=(Stage(0, 0, 2), Stage(1, 1, 1)),
                     layer_strategies=(LayerStrategy(dp=2), LayerStrategy()),
                     global_batch=2, micro_batch=1, num_microbatches=1)
