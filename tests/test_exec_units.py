"""Executor logic that needs no process group: rejections, data shards, ownership, stages."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from executors.data import global_batch_indices, local_rows, shard_batch, split_microbatches
from executors.layout import Layout, map_main_input, map_main_output
from executors.mesh import MeshAxis, ParallelDims
from executors.pipeline import (StageAnalysis, build_stage_module, cut_problem,
                                finish_stage_module, rank_stages)
from executors.tied import find_tie_groups, untie
from executors.validate import check_plan, layer_layout
from ir.errors import PlannerError
from ir.measure import build_layer_graph
from ir.plan import ParallelPlan, uniform_plan
from ir.strategy import LayerStrategy, Precision, Schedule, Stage
from ir.trace import model_output_tensor
from planner.models import load_layer_graph, load_model

GPT = "gpt:layers=4,hidden=64,heads=4,vocab=128,seq=32,dropout=0"
HF_GPT2 = "hf:tests/data/hf/gpt2/config.json"
HF_T5 = "hf:tests/data/hf/t5/config.json"


@functools.lru_cache(maxsize=None)
def graph_of(spec: str):
    return load_layer_graph(spec, micro_batch=2, seq_len=32, dtype=torch.float32)


def model_of(spec: str) -> nn.Module:
    return load_model(spec, micro_batch=1, seq_len=32, device="cpu", seed=0).module


def plan(spec: str = GPT, **kw) -> ParallelPlan:
    kw.setdefault("global_batch", 8)
    kw.setdefault("precision", Precision.FP32)
    return uniform_plan(len(graph_of(spec).layers), **kw)


# ----------------------------------------------------------------------------- data


def test_local_rows_cover_every_sample_once_per_step():
    rows = [local_rows(8, 2, 4, c).tolist() for c in range(4)]
    assert rows == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sorted(sum(rows, [])) == list(range(8))
    # a coarser layout's block is the concatenation of the finer layout's blocks
    coarse = local_rows(8, 2, 2, 1).tolist()
    assert coarse == [2, 3, 6, 7] and coarse == sorted(rows[2] + rows[3])


def test_shard_batch_keeps_non_batch_tensors_whole():
    ids, positions = torch.arange(16).view(8, 2), torch.arange(2).view(1, 2)
    local, target = shard_batch({"input_ids": ids, "position_ids": positions}, ids[:, 0],
                                global_batch=8, num_microbatches=1, dp=2, dp_index=1)
    assert local["input_ids"].tolist() == ids[4:].tolist()
    assert local["position_ids"] is positions and target.tolist() == [8, 10, 12, 14]
    assert len(split_microbatches(local["input_ids"], 2, 4)) == 2
    assert split_microbatches(positions, 2, 4) == [positions, positions]


def test_global_batches_are_the_same_on_every_rank_and_cover_the_epoch():
    a = list(global_batch_indices(10, 4, epoch=1, seed=3))
    b = list(global_batch_indices(10, 4, epoch=1, seed=3))
    assert [x.tolist() for x in a] == [x.tolist() for x in b] and len(a) == 2
    assert len(set(torch.cat(a).tolist())) == 8
    with pytest.raises(PlannerError, match="not divisible"):
        local_rows(6, 2, 2, 0)


# ----------------------------------------------------------------------------- layout


def test_layout_str_and_main_input_mapping():
    assert str(Layout(2, 2, True)) == "dp2·tp2·seq" and Layout(2, 2, True).full_sequence == Layout(2, 2)
    x, mask = torch.ones(2), torch.zeros(2)
    args, kwargs = map_main_input((3, x), {"mask": mask}, lambda t: t * 2)
    assert args[1].tolist() == [2.0, 2.0] and kwargs["mask"] is mask
    args, kwargs = map_main_input((), {"mask": mask, "hidden_states": x}, lambda t: t * 3)
    assert kwargs["hidden_states"].tolist() == [3.0, 3.0] and kwargs["mask"] is mask
    out = map_main_output((x, "aux"), lambda t: t + 1)
    assert out[0].tolist() == [2.0, 2.0] and out[1] == "aux"


def test_layer_layouts_follow_tp_and_sequence_parallel():
    p = plan(tp=2, dp=2, sequence_parallel=True)
    graph = graph_of(GPT)
    assert layer_layout(p, graph, 1) == Layout(2, 2, True)  # a block: SP
    assert layer_layout(p, graph, 0) == Layout(2, 2, False)  # the embedding: full sequence
    assert layer_layout(p, graph, 5) == Layout(2, 2, False)  # the norm: nothing to split


def test_parallel_dims_name_every_factor():
    dims = ParallelDims(world_size=8, pp=2, stage_devices=4, tp_degrees=(1, 2))
    c = dims.coordinate(6, 2)
    assert (c.pp_rank, c.dp_index, c.tp_index) == (1, 1, 0) and dims.dp(2) == 2
    assert str(MeshAxis.TP) == "tp"
    with pytest.raises(PlannerError, match="pp=2 x stage_devices=4 = 8 ranks but the process group has 6"):
        ParallelDims(world_size=6, pp=2, stage_devices=4, tp_degrees=(1,))


# ----------------------------------------------------------------------------- rejections


def test_check_plan_accepts_the_supported_plans():
    model, graph = model_of(GPT), graph_of(GPT)
    for p in (plan(dp=4, zero=3), plan(tp=2, dp=2, sequence_parallel=True),
              plan(pp=2, tp=2, micro_batch=2), plan(pp=2, virtual_stages=2, micro_batch=2,
                                                    schedule=Schedule.INTERLEAVED)):
        check_plan(model, p, graph, p.world_size, {"input_ids": torch.zeros(8, 32).long()})


@pytest.mark.parametrize("make, world, match", [
    (lambda: plan(dp=2), 4, "launch 2 processes"),
    (lambda: plan(tp=8), 8, r"tp=8 does not divide heads=4"),
    (lambda: plan(pp=2, micro_batch=8, global_batch=8), 2, "1F1B needs num_microbatches >= stages"),
    (lambda: plan(pp=2, virtual_stages=2, micro_batch=2, global_batch=10,
                  schedule=Schedule.INTERLEAVED), 2,
     "interleaved 1F1B needs num_microbatches"),
])
def test_check_plan_rejects_before_running(make, world, match):
    p = make()
    with pytest.raises(PlannerError, match=match):
        check_plan(model_of(GPT), p, graph_of(GPT), world)


def test_fused_conv1d_attention_splits_per_part():
    """GPT-2's fused c_attn (a Conv1D, [q | k | v]) is a column-parallel candidate split per
    packed projection (ir/tp.py), and a tp=2 plan of its blocks passes the executor check;
    a degree that does not divide the heads is refused naming the layer."""
    graph = graph_of(HF_GPT2)
    block = graph.layer("transformer.h.0")
    fused = {c.module: c.fused for c in block.tp_candidates}
    assert fused["attn.c_attn"] == (64, 64, 64) and fused["mlp.c_fc"] == ()
    check_plan(model_of(HF_GPT2), plan(HF_GPT2, tp=2), graph, 2)  # legal: no rejection
    with pytest.raises(PlannerError, match=r"layer transformer\.h\.0: tp=8 does not divide"):
        check_plan(model_of(HF_GPT2), plan(HF_GPT2, tp=8), graph, 8)


def test_hf_gpt2_pipeline_is_accepted_but_not_a_cut_between_its_embeddings():
    model, graph = model_of(HF_GPT2), graph_of(HF_GPT2)
    ids = {"input_ids": torch.zeros(8, 32, dtype=torch.long)}
    check_plan(model, plan(HF_GPT2, pp=2, micro_batch=2), graph, 2, ids)  # runs the stages
    # wte and wpe are summed in glue: after wpe both outputs would cross
    p = plan(HF_GPT2, pp=2, micro_batch=2, stage_boundaries=(2,))
    with pytest.raises(PlannerError, match=r"cannot cut after layer transformer\.wpe: other "
                                           r"tensors cross there; cut at one of layers \[0, 2"):
        check_plan(model, p, graph, 2)


def test_interleaved_stages_of_one_rank_share_the_input_layout():
    graph = graph_of(GPT)
    strategies = [LayerStrategy(tp=2, dp=1)] * 3 + [LayerStrategy(tp=1, dp=2)] * 4
    p = ParallelPlan(stages=(Stage(0, 1, 2), Stage(2, 2, 2), Stage(3, 4, 2), Stage(5, 6, 2)),
                     layer_strategies=tuple(strategies), global_batch=8, micro_batch=1,
                     num_microbatches=4, schedule=Schedule.INTERLEAVED, virtual_stages=2,
                     precision=Precision.FP32)
    with pytest.raises(PlannerError, match=r"pipeline stages \[0, 2\] run on the same ranks "
                                           r"but their first layers lay the batch out"):
        check_plan(model_of(GPT), p, graph, 4)


def test_changing_dp_needs_single_input_layers():
    graph = graph_of(HF_GPT2)
    n = len(graph.layers)
    # the position embedding's input is (1, T) position ids from glue, not a batch
    strategies = [LayerStrategy(tp=1, dp=2), LayerStrategy(tp=2, dp=1)] + \
        [LayerStrategy(tp=1, dp=2)] * (n - 2)
    p = ParallelPlan(stages=(Stage(0, n - 1, 2),), layer_strategies=tuple(strategies),
                     global_batch=8, micro_batch=4, num_microbatches=1,
                     precision=Precision.FP32)
    with pytest.raises(PlannerError, match=r"layer transformer\.wpe: its data-parallel degree "
                                           r"would change \(tp 1 -> 2\)"):
        check_plan(model_of(HF_GPT2), p, graph, 2)


def test_sequence_parallel_needs_a_divisible_sequence():
    graph = load_layer_graph(GPT, micro_batch=1, seq_len=30, dtype=torch.float32)
    p = uniform_plan(len(graph.layers), tp=4, sequence_parallel=True, global_batch=4,
                     precision=Precision.FP32)
    with pytest.raises(PlannerError, match=r"layer blocks\.0: sequence parallel needs the "
                                           r"sequence length \(30\) divisible by tp=4"):
        check_plan(model_of(GPT), p, graph, 4)


# ----------------------------------------------------------------------------- pieces


def test_stage_modules_keep_names_and_drop_the_rest():
    graph, p = graph_of(GPT), plan(pp=2, virtual_stages=2, micro_batch=2,
                                   schedule=Schedule.INTERLEAVED)
    assert rank_stages(p, 0) == [0, 2] and rank_stages(p, 1) == [1, 3]
    model = model_of(GPT)
    stage = build_stage_module(model, graph, p, 1, make_copy=True, analysis=None)
    layers = range(p.stages[1].first_layer, p.stages[1].last_layer + 1)
    owners = {graph.layers[j].name for j in layers}
    names = {n for n, _ in stage.named_parameters()}
    assert names == {n for n, _ in model.named_parameters() if n.rpartition(".")[0] in owners
                     or any(n.startswith(o + ".") for o in owners)}
    assert type(stage.embed).__name__ == "StandIn" and not list(stage.embed.parameters())


def _two_stages(model: nn.Module, graph, boundary: int, inputs: dict) -> list[nn.Module]:
    p = uniform_plan(len(graph.layers), pp=2, global_batch=2, precision=Precision.FP32,
                     stage_boundaries=(boundary,))
    analysis = StageAnalysis(model, graph, p)
    analysis.prepare(inputs)
    stages = [build_stage_module(model, graph, p, s, make_copy=True, analysis=analysis)
              for s in (0, 1)]
    for stage in stages:
        finish_stage_module(stage)
    return stages


@pytest.mark.parametrize("spec, boundary", [
    (HF_GPT2, 3), (HF_T5, 3), (HF_T5, 4), ("hf:tests/data/hf/gemma/config.json", 1),
    ("hf:tests/data/hf/qwen2/config.json", 2), ("hf:tests/data/hf/mixtral/config.json", 2),
    ("hf:tests/data/hf/bart/config.json", 5)])
def test_hf_stage_modules_compose_to_the_model(spec, boundary):
    """T5: after encoder.block.1 the boundary is a (hidden, position_bias) tuple whose
    bias is stood in by zeros; after the encoder the decoder reads the received tensor.
    Gemma scales the embedding in glue; Qwen2's glue reads each decoder layer's
    `attention_type` (the stand-in answers); Mixtral's experts run under fake tensors."""
    loaded = load_model(spec, micro_batch=2, seq_len=32, device="cpu", seed=0)
    model, inputs = loaded.module.eval(), loaded.inputs  # eval: no dropout
    first, second = _two_stages(model, graph_of(spec), boundary, inputs)
    with torch.no_grad():
        hidden = first(**inputs)
        assert torch.equal(second(hidden, **inputs), model_output_tensor(model(**inputs)))
    assert not any(n.startswith("transformer.h.0.") for n, _ in second.named_parameters())


class _Twice(nn.Module):
    """One block module called twice per forward: no stage can stand in for it."""

    def __init__(self):
        super().__init__()
        self.embed, self.block, self.head = nn.Embedding(8, 4), nn.Linear(4, 4), nn.Linear(4, 8)

    def forward(self, ids):
        return self.head(self.block(self.block(self.embed(ids))))


class _Cycle(nn.Module):
    """Module a runs before and after b: the layer IR merges them into layer "a+b"."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.c(self.a(self.b(self.a(x))))


class _AuxFirst(nn.Module):
    """Blocks return (aux, hidden): what crosses a cut is not their main (first) output."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.zeros((), device=x.device), self.fc(x)

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(8, 4), nn.Linear(4, 8)
        self.blocks = nn.ModuleList([self.Block(), self.Block()])

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)[1]
        return self.head(x)


@pytest.mark.parametrize("make, match", [
    (_Twice, r"layer block runs 2 times in one forward"),
    (_AuxFirst, r"pipeline stage 1 \(layers blocks\.1\.\.head\) uses an output of layer "
                r"blocks\.0 other than what crosses its cut"),
])
def test_stages_that_cannot_run_are_rejected_before_any_step(make, match):
    model, inputs = make(), {"ids": torch.zeros(2, 3, dtype=torch.long)}
    graph = build_layer_graph(model, inputs, name=make.__name__)
    boundary = 2 if len(graph.layers) > 3 else 1
    if boundary - 1 not in graph.cut_points:  # the IR allows the cut; only running shows it
        pytest.fail(f"the layer IR does not offer the cut: {graph.cut_points}")
    p = uniform_plan(len(graph.layers), pp=2, global_batch=2, precision=Precision.FP32,
                     stage_boundaries=(boundary,))
    with pytest.raises(PlannerError, match=match):
        check_plan(model, p, graph, 2, inputs)


def test_plans_sharing_an_analysis_run_each_passing_stage_once(monkeypatch):
    """`check_plan(..., analysis=)`: a layer range that passed is not run again for the
    next plan; one that failed fails again, and a new range is always run."""
    runs = []
    original = StageAnalysis._check_stage
    monkeypatch.setattr(StageAnalysis, "_check_stage", lambda self, plan, s, *a: (
        runs.append((plan.stages[s].first_layer, plan.stages[s].last_layer)),
        original(self, plan, s, *a)))
    model, inputs = _AuxFirst(), {"ids": torch.zeros(2, 3, dtype=torch.long)}
    graph = build_layer_graph(model, inputs, name="aux_first")
    analysis = StageAnalysis(model, graph)
    good, bad = (uniform_plan(4, pp=2, global_batch=2, precision=Precision.FP32,
                              stage_boundaries=(b,)) for b in (1, 2))
    bf16 = build_layer_graph(model, inputs, name="aux_first", dtype=torch.bfloat16)
    for g in (graph, bf16):  # the same layers in another dtype: served by the same analysis
        check_plan(model, good, g, 2, inputs, analysis)
    assert runs == [(0, 0), (1, 3)]
    for _ in range(2):
        with pytest.raises(PlannerError, match=r"pipeline stage 1 \(layers blocks\.1\.\.head"):
            check_plan(model, bad, graph, 2, inputs, analysis)
    assert runs[2:] == [(0, 1), (2, 3), (2, 3)]
    with pytest.raises(ValueError, match="another model or layers"):
        check_plan(_AuxFirst(), good, graph, 2, inputs, analysis)
    twice = build_layer_graph(_Twice(), inputs, name="twice")  # 3 layers, other names
    with pytest.raises(ValueError, match="another model or layers"):
        check_plan(model, uniform_plan(3, pp=2, global_batch=2, precision=Precision.FP32),
                   twice, 2, inputs, analysis)


def test_an_analysis_does_not_keep_its_model_alive():
    """`apply` copies the model per stage under interleaving and drops the original; an
    analysis the run keeps that held it kept every stage's parameters allocated (validate
    measured gpt-tp2-pp2-dp2's peak 0.85 MiB over the prediction)."""
    import gc
    import weakref

    model, inputs = _AuxFirst(), {"ids": torch.zeros(2, 3, dtype=torch.long)}
    analysis = StageAnalysis(model, build_layer_graph(model, inputs, name="aux_first"))
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None and analysis.graph is not None


def test_untie_gives_the_head_its_own_copy():
    model, graph = model_of(GPT), graph_of(GPT)
    groups = find_tie_groups(model, graph)
    assert [(g.layers, g.names) for g in groups] == [((0, 6), (("embed.tok.weight",),
                                                               ("head.weight",)))]
    untie(model, groups)
    assert model.head.weight is not model.embed.tok.weight
    assert torch.equal(model.head.weight, model.embed.tok.weight)


def test_merged_layers_cannot_be_cut():
    graph = build_layer_graph(_Cycle(), {"x": torch.zeros(2, 4)}, name="cycle")
    assert [layer.name for layer in graph.layers] == ["a+b", "c"] and graph.cut_points == (0,)
    p = uniform_plan(2, pp=2, global_batch=2, precision=Precision.FP32)
    # one rule (`ir.legality.merged_layer_problem`), asked before the cut's
    assert cut_problem(graph, p) is None
    with pytest.raises(PlannerError, match=r"^layer a\+b: modules called at several places"):
        check_plan(_Cycle(), p, graph, 2)


def test_a_layer_reading_the_model_inputs_keeps_the_first_layers_split():
    """Whisper: conv1 tp2 (dp1) then the rest tp1 (dp2) re-splits the encoder's chain, but
    the decoder's embed_tokens reads decoder_input_ids, which arrive split as conv1 is
    (the auto plan that crashed with 'input batch_size 64 vs target 32')."""
    spec = "hf:tests/data/hf/whisper/config.json"
    graph = graph_of(spec)
    n = len(graph.layers)
    strategies = (LayerStrategy(tp=2, dp=1),) + (LayerStrategy(tp=1, dp=2),) * (n - 1)
    bad = ParallelPlan(stages=(Stage(0, n - 1, 2),), layer_strategies=strategies,
                       global_batch=8, micro_batch=4, num_microbatches=1,
                       schedule=Schedule.ONE_F_ONE_B, precision=Precision.FP32,
                       optimizer="adamw")
    with pytest.raises(PlannerError, match=r"layer model\.(en|de)coder\.\w+: it may read "
                                           "the model's inputs, which reach its stage split "
                                           r"as layer model\.encoder\.conv1 \(tp 2\)"):
        check_plan(model_of(spec), bad, graph, 2)

