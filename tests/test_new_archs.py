"""IR and legality facts exposed by Hugging Face architectures outside the acceptance
matrix (tests/data/hf/<arch>, run with bench/bench_real_models.py --arch): each test
pins the trace-level fact that made a plan crash, mismatch or be refused vaguely."""

from __future__ import annotations

import functools

import torch

from ir.legality import layout_change_problem
from planner.models import load_layer_graph


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
