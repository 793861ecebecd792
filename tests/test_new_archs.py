"""IR and legality facts exposed by Hugging Face architectures outside the acceptance
matrix (tests/data/hf/<arch>, run with bench/bench_real_models.py --arch): each test
pins the trace-level fact that made a plan crash, mismatch or be refused vaguely."""

from __future__ import annotations

import functools
import re

import pytest
import torch
from torch import nn

from executors.validate import check_plan
from ir.errors import PlannerError
from ir.legality import layout_change_problem, weight_outside_layers_problem
from ir.plan import uniform_plan
from ir.strategy import Precision
from planner.models import load_layer_graph, load_model
from planner.search_space import SearchOptions, outer_candidates


def _spec(arch: str) -> str:
    return f"hf:tests/data/hf/{arch}/config.json"


@functools.lru_cache(maxsize=None)
def _graph(arch: str):
    return load_layer_graph(_spec(arch), 1, None, torch.float32)


def test_glue_that_bakes_the_batch_into_a_shape_links_the_layer_to_its_neighbour():
    # GPTBigCode: `ln_f(h).view(output_shape)` in the model's forward, output_shape taken
    # from the input's batch; a trace bakes it ([rows, seq, hidden]). The view runs on
    # ln_f's output in ln_f's batch split, so the head may not re-split the batch after
    # it (a tp2 ln_f between tp1 layers crashed: shape '[2, 16, 64]' is invalid ...)
    graph = _graph("gpt_bigcode")
    names = [l.name for l in graph.layers]
    head = names.index("lm_head")
    assert names[head - 1] == "transformer.ln_f"
    assert graph.layers[head - 1].chain_input  # h.1 -> ln_f: no glue between
    assert not graph.layers[head].chain_input
    problem = layout_change_problem(graph, head, 2, 1)
    assert problem and problem.startswith("layer lm_head: its data-parallel degree would change")


def test_mask_glue_shared_by_two_attention_kinds_does_not_merge_the_layers():
    # GPT-OSS: sliding-window and full-attention layers alternate; both masks are built
    # from one arange in the model's forward. That glue joined layer 1 (the full mask's
    # user) while layer 0's sliding mask read it: a cycle that merged both decoder layers
    # into 'model.layers.0+model.layers.1', which no pipeline can cut and the executor
    # could not find as a module
    names = [l.name for l in _graph("gpt_oss").layers]
    assert names == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
                     "lm_head"]


def test_a_weight_read_outside_every_layer_is_refused_in_one_line_by_search_and_executor():
    # DeBERTa-v2: the encoder (which holds the block stack, so is no layer) reads
    # `rel_embeddings.weight` in its own forward and hands it to every block; layer 0,
    # its first user, owns it in the layer IR, but no layer's module holds it, so no
    # strategy can shard it or average its gradient. The executor refused it as a
    # parameter that "belongs to no layer ...; re-trace the model"
    graph = _graph("deberta-v2")
    line = (r"^layer deberta\.encoder\.layer\.0 reads parameter "
            r"deberta\.encoder\.rel_embeddings\.weight from outside its module")
    assert re.match(line, weight_outside_layers_problem(graph))
    with pytest.raises(PlannerError, match=line):
        outer_candidates(graph, 2, 8, SearchOptions(pp=1))
    plan = uniform_plan(len(graph.layers), dp=2, micro_batch=4, global_batch=8,
                        precision=Precision.FP32)
    with pytest.raises(PlannerError, match=line):
        check_plan(load_model(_spec("deberta-v2"), device="meta").module, plan, graph, 2)
    assert weight_outside_layers_problem(_graph("gpt_bigcode")) is None


def test_an_attention_owning_a_per_head_parameter_is_not_split():
    # GPT-OSS: each attention owns `sinks` ([heads], a learned logit per head) directly;
    # TP splits the heads of q/k/v but not that parameter, so the tp2 run concatenated 8
    # sinks onto 4 heads' logits, and the executor's self-check refused it as "reshapes
    # with global sizes". A parent owning a parameter of its own stays whole, as one
    # holding a non-projection parameter module (T5's relative-position table) does.
    for layer in _graph("gpt_oss").layers:
        assert not [c for c in layer.tp_candidates if c.module.startswith("self_attn.")], \
            layer.name


class DimGlue(nn.Module):
    """Two Linear layers; between them the parent's code permutes twice and adds a
    sum over a dim list: int lists that are no shape, so they bake no batch."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        h = torch.permute(torch.permute(self.layers[0](x), [1, 0]), [1, 0])
        h = h + torch.sum(h, dim=[1], keepdim=True)
        return torch.amax(self.layers[1](h), dim=[1])


def test_glue_passing_dims_but_no_shape_keeps_the_layer_chained():
    from tests.test_cold_entry import _measured

    graph, _ = _measured(DimGlue())
    assert [l.name for l in graph.layers] == ["layers.0", "layers.1"]
    assert graph.layers[1].chain_input


class SinkAttention(nn.Module):
    """An attention that is itself the layer module: q/k/v/o projections as its direct
    children, and a learned logit per head (`sinks`, as GPT-OSS's) it owns."""

    def __init__(self, heads: int = 2, width: int = 8):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(width, width) for _ in range(4))
        self.sinks = nn.Parameter(torch.zeros(heads))

    def forward(self, x):
        shape = (x.shape[0], self.heads, x.shape[1] // self.heads)
        q, k, v = (p(x).view(shape) for p in (self.q_proj, self.k_proj, self.v_proj))
        weights = torch.softmax((q * k).sum(-1) + self.sinks, dim=-1)
        return self.o_proj((weights.unsqueeze(-1) * v).reshape(x.shape))


class SinkStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(SinkAttention() for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_layer_that_is_an_attention_owning_a_per_head_parameter_is_not_split():
    # the rule above where the attention is the layer module itself (parent ""): the
    # search offered TP plans the executor's self-check refuses
    from tests.test_cold_entry import _measured

    graph, _ = _measured(SinkStack())
    assert [l.name for l in graph.layers] == ["layers.0", "layers.1"]
    for layer in graph.layers:
        assert not layer.tp_candidates, layer.name
