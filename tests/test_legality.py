"""The search and the executor are one contract (`ir.legality`).

The acceptance test of the contract: for Hugging Face architectures nobody here wrote
and for the zoo, the top plans `planner plan` would print on a local CPU job (2 and 4
processes) and on two A100 nodes all pass the executor's own check (`check_plan`), which
reads the live module as well as the IR. The rest pins the IR facts the search reads.
"""

from __future__ import annotations

import functools

import pytest
import torch

from cost_models.clusters import get_cluster
from executors.pipeline import StageAnalysis
from executors.validate import check_plan
from ir.errors import PlannerError
from ir.legality import layout_change_problem, linked_runs
from ir.plan import ParallelPlan, uniform_plan
from ir.strategy import LayerStrategy, Precision, Stage
from planner.commands.estimate import default_precision
from planner.models import load_layer_graph, load_model
from planner.search import search
from planner.search_space import SearchOptions, layer_strategies, outer_candidates

HF_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2",
            "gpt_neox", "falcon", "opt", "bert", "roberta", "t5", "bart", "vit", "whisper",
            "mixtral", "qwen2_moe", "deepseek_v3")
ZOO = ("gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny", "mlp-small", "cnn-small", "dlrm-small")
MODELS = tuple(f"hf:tests/data/hf/{a}/config.json" for a in HF_ARCHS) + ZOO
# (preset, nodes, devices per node, global batch): `planner plan MODEL --cluster local
# --gpus-per-node 2|4` and `--cluster a100-80g --nodes 2`.
CLUSTERS = (("local", 1, 2, 8), ("local", 1, 4, 8), ("a100-80g", 2, None, 64))
TOP_K = 5


def _cluster(preset: str, nodes: int, per_node: int | None):
    kwargs = {"nodes": nodes} if per_node is None else {"nodes": nodes, "gpus_per_node": per_node}
    return get_cluster(preset, **kwargs)


@functools.lru_cache(maxsize=None)
def _graph(spec: str, dtype: torch.dtype):
    return load_layer_graph(spec, 1, None, dtype)  # as `planner plan` traces


@pytest.mark.parametrize("spec", MODELS)
def test_top_plans_pass_the_executor_check(spec):
    # as auto_parallel calls it: with example inputs, so pipelines are also checked by
    # running every stage under fake tensors (`executors.pipeline.StageAnalysis`)
    loaded = load_model(spec, micro_batch=1, device="cpu", seed=0)
    model, inputs = loaded.module, loaded.inputs
    # one for every graph (they name the same layers): a stage several plans cut alike
    # runs once (`check_plan`)
    analysis = StageAnalysis(model, _graph(spec, torch.float32))
    rejected = []
    for preset, nodes, per_node, global_batch in CLUSTERS:
        cluster = _cluster(preset, nodes, per_node)
        precision = default_precision(cluster)
        graph = _graph(spec, getattr(torch, precision.compute_dtype))
        result = search(graph, cluster, global_batch,
                        SearchOptions(precision=precision, top_k=TOP_K))
        assert result.candidates, f"{spec} on {cluster.name}: no plan"
        for cand in result.candidates[:TOP_K]:
            try:
                check_plan(model, cand.plan, graph, cluster.world_size, inputs, analysis)
            except PlannerError as exc:
                rejected.append(f"{cluster.name} x{cluster.world_size} {cand.plan}: {exc}")
    assert not rejected, "plans the executor rejects:\n" + "\n".join(rejected)


# ----------------------------------------------------------------------------- IR facts

HF_LLAMA = "hf:tests/data/hf/llama/config.json"


def test_hf_decoder_layers_take_masks_so_their_tp_degree_is_linked():
    graph = _graph(HF_LLAMA, torch.float32)
    names = [l.name for l in graph.layers]
    assert names == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
                     "lm_head"]
    # decoder layers also take the mask and rotary tables; the norm and head take one tensor
    assert [l.chain_input for l in graph.layers[1:]] == [False, False, True, True]
    assert linked_runs(graph) == [(0, 2)]
    assert layout_change_problem(graph, 3, 2, 1) is None
    problem = layout_change_problem(graph, 2, 1, 2)
    assert problem.startswith("layer model.layers.1: its data-parallel degree would change")


def test_zoo_blocks_take_one_tensor():
    graph = _graph("gpt-tiny", torch.float32)
    assert all(l.chain_input for l in graph.layers[1:])
    assert linked_runs(graph) == []
    assert "divide one another" in layout_change_problem(graph, 2, 2, 3)


def test_sequence_parallel_is_offered_only_where_it_runs():
    graph = _graph(HF_LLAMA, torch.float32)
    offered = {l.name: {s.sequence_parallel for s in layer_strategies(
        l, 4, 8, SearchOptions(), graph.seq_len)} for l in graph.layers}
    assert offered["model.layers.0"] == {False, True}
    for name in ("model.embed_tokens", "model.norm", "lm_head"):
        assert offered[name] == {False}, name
    pinned = {s.sequence_parallel for l in graph.layers for s in layer_strategies(
        l, 4, 8, SearchOptions(sequence_parallel=True), graph.seq_len)}
    assert pinned == {False, True}  # the pin sets SP where it runs, and nowhere else


def test_searched_layouts_never_change_into_a_linked_layer():
    graph = _graph(HF_LLAMA, torch.bfloat16)
    result = search(graph, _cluster("a100-80g", 2, None), 64, SearchOptions(top_k=TOP_K))
    for cand in result.candidates:
        tps = [s.tp for s in cand.plan.layer_strategies]
        assert len(set(tps[:3])) == 1, (str(cand.plan), tps)  # embed + decoder layers


class _Shared(torch.nn.Module):
    """One Linear called twice: its two uses merge into one layer."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(4, 4)
        self.shared = torch.nn.Linear(4, 4)
        self.mid = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.shared(self.mid(self.shared(self.inp(x))))


def test_a_model_with_merged_layers_is_refused_by_search_and_executor_alike():
    # the executor applies a strategy to one module per layer (even at pp=1), so the
    # search offered plans it then refused as "not a module of this model" (GPT-OSS)
    from ir.measure import build_layer_graph

    model = _Shared()
    x = torch.zeros(4, 4)
    graph = build_layer_graph(model, {"x": x}, torch.zeros(4, 4),
                              torch.nn.functional.mse_loss, name="shared")
    line = r"^layer shared\+mid: modules called at several places are merged into one layer"
    for pp in (None, 1, 2):
        with pytest.raises(PlannerError, match=line):
            outer_candidates(graph, 4, 8, SearchOptions(pp=pp))
    plan = uniform_plan(len(graph.layers), dp=2, micro_batch=4, global_batch=8,
                        precision=Precision.FP32)
    with pytest.raises(PlannerError, match=line):
        check_plan(model, plan, graph, 2)


def test_executor_rejects_a_hand_written_tp_change_into_a_linked_layer():
    graph = _graph(HF_LLAMA, torch.float32)
    n = len(graph.layers)
    tps = [2, 2, 1, 1, 1]
    plan = ParallelPlan(stages=(Stage(0, n - 1, 2),),
                        layer_strategies=tuple(LayerStrategy(tp=t, dp=2 // t) for t in tps),
                        global_batch=8, micro_batch=4, num_microbatches=1,
                        precision=Precision.FP32)
    with pytest.raises(PlannerError, match=r"^layer model\.layers\.1: its data-parallel"):
        check_plan(load_model(HF_LLAMA, device="meta").module, plan, graph, 2)
