"""The layer IR: parameter counts, FLOPs, activation bytes, grouping, cut points, errors."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from ir.errors import PlannerError
from ir.layer import TPStyle
from ir.measure import build_layer_graph
from planner.models import load_layer_graph, load_model
from tests.factories import DataDependent
from tests.layer_graphs import layer_graph

TINY_PRESETS = ["gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny", "mlp-small", "cnn-small",
                "dlrm-small"]
HF_CONFIGS = {name: f"tests/data/hf/{name}/config.json" for name in ("gpt2", "llama", "bert", "t5")}


def _true_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() dedups tied weights


@functools.lru_cache(maxsize=None)
def _zoo_graph(spec: str):
    """`load_layer_graph(spec)` once for the tests that only read it: gpt3-175b's trace is
    ~2-5 s here and two tests read it (`layer_graph`: other files read it too)."""
    return layer_graph(spec)


@pytest.mark.parametrize("spec", TINY_PRESETS + ["gpt3-175b", "llama3-8b"])
def test_zoo_parameter_counts_are_exact(spec):
    loaded = load_model(spec)
    graph = _zoo_graph(spec)
    assert graph.num_params == _true_params(loaded.module)
    assert sum(layer.params for layer in graph.layers) == graph.num_params
    assert graph.trace_method == "fx"


def test_gpt3_175b_parameter_count_matches_megatron():
    graph = _zoo_graph("gpt3-175b")
    assert abs(graph.num_params - 174.6e9) / 174.6e9 < 0.005
    assert graph.unique_layers_measured == 4  # embedding, one block (for 96), norm, head
    assert sum(1 for l in graph.layers if l.kind == "Block") == 96


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hugging_face_models_trace_with_export_and_count_exactly(name):
    spec = f"hf:{HF_CONFIGS[name]}"
    loaded = load_model(spec, seq_len=16)
    graph = load_layer_graph(spec, seq_len=16)
    assert graph.trace_method == "export"  # transformers 5 models defeat torch.fx
    assert graph.num_params == _true_params(loaded.module)
    assert sum(layer.params for layer in graph.layers) == graph.num_params
    blocks = [l for l in graph.layers if l.kind in ("GPT2Block", "LlamaDecoderLayer",
                                                    "BertLayer", "T5Block")]
    assert len(blocks) >= 2
    for block in blocks:
        styles = {c.style for c in block.tp_candidates}
        # separate q/k/v and MLP linears split Megatron-style; GPT-2's fused Conv1D c_attn
        # splits per packed projection (ir/tp.py)
        assert styles == {TPStyle.COLWISE, TPStyle.ROWWISE}, block.name
        if block.kind == "GPT2Block":
            assert any(c.fused for c in block.tp_candidates), block.name


# A GPT block at a size where every term is visible: s=128, b=2, h=256, a=8.
S, B, H, A = 128, 2, 256, 8
GPT_SPEC = f"gpt:layers=2,hidden={H},heads={A},vocab=512,seq={S}"


@pytest.fixture(scope="module")
def gpt_block():
    graph = load_layer_graph(GPT_SPEC, micro_batch=B, dtype=torch.bfloat16)
    return graph.layer("blocks.1")


def test_gpt_block_flops_match_megatron(gpt_block):
    expected = 24 * B * S * H**2 + 4 * B * S**2 * H  # Narayanan et al. 2021, matmuls only
    assert abs(gpt_block.flops_fwd - expected) / expected < 0.01
    assert abs(gpt_block.flops_bwd - 2 * expected) / (2 * expected) < 0.01


def test_gpt_block_saved_bytes_match_korthikanti(gpt_block):
    """Korthikanti et al. 2022, Table 2: s·b·h·(34 + 5·a·s/h) bytes, 16-bit, dropout on.

    What autograd saves in the zoo block, per s·b·h (bf16, 2 bytes each unless said):
      ln1 input 2; q/k/v input 2 (one storage, saved by three linears); Q and K^T copies
      made by the batched matmul 2 + 2; softmax output 2·a·s/h; attention dropout mask;
      dropout output 2·a·s/h (saved by att @ v); V copy 2; proj input 2; residual dropout
      mask; ln2 input 2; fc1 input 2; GELU input 8; fc2 input 8; MLP dropout mask.
    That is Korthikanti's 34·s·b·h + 5·a·s²·b once the three dropout masks cost one byte
    per element, as CUDA's fused dropout stores them (`saved_bytes_on("cuda", 2)`).
    Two small extras Korthikanti leaves out: the causal mask (s² bools) and LayerNorm's
    mean and rstd (fp32, 2 LayerNorms x 2 x s·b x 4 bytes).
    On CPU/meta the unfused dropout keeps its masks in bf16: one more byte per element.
    """
    sbh = S * B * H
    korthikanti = sbh * (34 + 5 * A * S / H)
    extras = S * S + 2 * 2 * S * B * 4
    assert gpt_block.saved_bytes_on("cuda", 2) == korthikanti + extras
    assert abs(gpt_block.saved_bytes_on("cuda", 2) - korthikanti) / korthikanti < 0.05
    masks_bf16 = 2 * (A * S * S * B + 2 * sbh)  # attention mask + two residual masks
    assert gpt_block.saved_dropout_mask_bytes == masks_bf16
    assert gpt_block.saved_activation_bytes == korthikanti + extras + masks_bf16 // 2


def test_gpt_block_tp_sharded_and_attention_parts(gpt_block):
    """Korthikanti Table 2, TP row: s·b·h·(10 + 24/t + 5·a·s/(h·t)): 24·sbh + 5·a·s²·b is
    split by t (the causal mask, created inside the region, is counted with it), 10·sbh is
    not; selective recompute drops the 5·a·s²·b scores (softmax out, mask, dropout out)."""
    sbh = S * B * H
    mask_bf16_extra = A * S * S * B  # attention dropout mask: 2 bytes on CPU, 1 in the formula
    assert gpt_block.saved_tp_sharded_bytes == 24 * sbh + 5 * A * S * S * B + S * S + mask_bf16_extra
    assert gpt_block.saved_attention_bytes == 5 * A * S * S * B + mask_bf16_extra
    assert gpt_block.input_bytes == sbh * 2 == gpt_block.output_bytes  # full recompute: 2·s·b·h
    assert gpt_block.saved_input_bytes == sbh * 2  # ln1 saves the block input
    assert gpt_block.saved_output_bytes == 0  # the residual sum is saved by nobody


def test_boundary_tensors_saved_on_both_sides_are_recorded():
    """A CNN block ends in a ReLU that saves its output; the next conv saves the same
    tensor as its input. Both layers record it, so a cost model can count it once."""
    graph = load_layer_graph("cnn-small", dtype=torch.float32)
    first, second = graph.layer("blocks.0"), graph.layer("blocks.1")
    assert first.saved_output_bytes > 0
    assert first.saved_output_bytes == second.saved_input_bytes


def test_fx_and_export_agree():
    loaded = load_model("gpt-tiny")
    args = (loaded.module, loaded.inputs, loaded.target, loaded.loss_fn)
    fx_graph = build_layer_graph(*args, name="g", force_trace="fx")
    ex_graph = build_layer_graph(*args, name="g", force_trace="export")
    assert fx_graph.trace_method == "fx" and ex_graph.trace_method == "export"
    assert [l.name for l in fx_graph.layers] == [l.name for l in ex_graph.layers]
    for a, b in zip(fx_graph.layers, ex_graph.layers):
        assert (a.params, a.flops_fwd, a.flops_bwd, a.saved_activation_bytes, a.output_bytes) == \
               (b.params, b.flops_fwd, b.flops_bwd, b.saved_activation_bytes, b.output_bytes), a.name


def test_export_records_no_python_stack_per_node():
    """torch.fx symbolises the Python stack at every node it makes (`Node.stack_trace`),
    which nothing here reads: export traces without it, and torch's flag is as it was."""
    import torch.fx.config as fx_config

    from ir.trace import trace

    before = fx_config.do_not_emit_stack_traces
    loaded = load_model("gpt-tiny")
    traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn, force="export")
    assert traced.method == "export"
    assert [n.name for n in traced.graph_module.graph.nodes if n.stack_trace] == []
    assert fx_config.do_not_emit_stack_traces is before


def test_layers_tp_candidates_and_divisors():
    graph = load_layer_graph("llama-tiny")
    names = [l.name for l in graph.layers]
    assert names == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "head"]
    block = graph.layer("blocks.0")
    divisors = dict(block.tp_divisors)
    assert divisors["heads"] == 8 and divisors["kv_heads"] == 4
    assert block.tp_degree_allowed(4) and not block.tp_degree_allowed(8)
    assert "kv_heads=4" in block.tp_violation(8)
    assert graph.layer("embed").tp_candidates[0].style is TPStyle.VOCAB
    assert graph.layer("head").tp_candidates[0].style is TPStyle.HEAD
    assert graph.layer("norm").tp_degree_allowed(2)  # nothing to split: replicated in the group
    # tied GPT head: the weight belongs to the embedding, so the head owns nothing
    gpt = load_layer_graph("gpt-tiny")
    assert gpt.layer("head").params == 0 and gpt.layer("head").tp_params == 0


def test_cut_points_follow_single_tensor_boundaries():
    gpt = load_layer_graph("gpt-tiny")
    assert gpt.cut_points == tuple(range(len(gpt.layers) - 1))
    t5 = load_layer_graph("t5-tiny")
    names = [l.name for l in t5.layers]
    dec0 = names.index("decoder_blocks.0")
    # Inside the decoder both the encoder output and the decoder state cross a cut.
    assert dec0 - 1 not in t5.cut_points and dec0 not in t5.cut_points
    assert names.index("encoder_norm") in t5.cut_points  # only the encoder output crosses
    assert t5.graph.number_of_nodes() == len(t5.layers)
    enc_out = names.index("encoder_norm")
    assert any(s == enc_out and d > dec0 for s, d, _ in t5.edges)  # the skip edge


def test_structural_hash_dedups_identical_blocks():
    graph = load_layer_graph("gpt:layers=12,hidden=64,heads=4,vocab=128,seq=16")
    hashes = {l.structural_hash for l in graph.layers if l.kind == "Block"}
    assert len(hashes) == 1 and graph.unique_layers_measured == 4


def test_fingerprint_changes_with_shape():
    a = load_layer_graph("gpt-tiny")
    assert a.fingerprint == load_layer_graph("gpt-tiny").fingerprint
    assert a.fingerprint != load_layer_graph("gpt-tiny", micro_batch=2).fingerprint


def test_untraceable_model_gives_one_line_error():
    x = torch.randn(2, 4)
    with pytest.raises(PlannerError) as info:
        build_layer_graph(DataDependent(), {"x": x}, name="dd")
    message = str(info.value)
    assert "\n" not in message
    assert "DataDependent" in message and "data-dependent" in message


def test_unknown_preset_lists_known_ones():
    with pytest.raises(PlannerError) as info:
        load_model("gpt-huge")
    assert "gpt3-175b" in str(info.value) and "llama3-8b" in str(info.value)


def test_bad_override_names_the_field():
    with pytest.raises(PlannerError) as info:
        load_model("gpt:layerz=2")
    assert "layerz" in str(info.value) and "layers" in str(info.value)


# Vision and speech configs name their head in "architectures"; the example inputs follow it.
HF_HEADS = [("vit", "ViTForImageClassification", {"pixel_values": (2, 3, 32, 32)}, (2,)),
            ("whisper", "WhisperForConditionalGeneration",
             {"input_features": (2, 16, 64), "decoder_input_ids": (2, 64)}, (2, 64))]


@pytest.mark.parametrize("arch,head,input_shapes,target_shape", HF_HEADS)
def test_hf_builds_the_configs_head_with_its_inputs(arch, head, input_shapes, target_shape):
    spec = f"hf:tests/data/hf/{arch}/config.json"
    loaded = load_model(spec, micro_batch=2)
    assert type(loaded.module).__name__ == head and loaded.name == f"hf:{arch}:{head}"
    assert {k: tuple(v.shape) for k, v in loaded.inputs.items()} == input_shapes
    assert tuple(loaded.target.shape) == target_shape and not loaded.target.is_floating_point()
    graph = load_layer_graph(spec, micro_batch=2)
    assert graph.model == loaded.name and graph.trace_method == "export"
    assert graph.num_params == _true_params(loaded.module)


def test_hf_default_heads_and_bad_heads(tmp_path):
    assert type(load_model("hf:tests/data/hf/bert/config.json").module).__name__ == "BertForMaskedLM"
    assert type(load_model("hf:tests/data/hf/t5/config.json").module).__name__ == \
        "T5ForConditionalGeneration"
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "whisper"}')  # not WhisperForCausalLM: it has an encoder
    assert type(load_model(f"hf:{config}").module).__name__ == "WhisperForConditionalGeneration"
    config.write_text('{"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1, '
                      '"num_attention_heads": 2, "intermediate_size": 32, "image_size": 16, '
                      '"patch_size": 8, "architectures": ["ViTModel"]}')
    with pytest.raises(PlannerError, match=r"architectures\[0\] 'ViTModel' has no loss planner "
                                           r"can train .*; use 'ViTForImageClassification'"):
        load_model(f"hf:{config}")
    config.write_text('{"model_type": "whisper", "architectures": ["WhisperForCausalLMz"]}')
    with pytest.raises(PlannerError, match=r"'WhisperForCausalLMz' is not a class of "
                                           r"transformers .*; use 'WhisperForConditionalGeneration'"):
        load_model(f"hf:{config}")


def test_hf_head_of_another_model_type_or_unbatchable_is_one_line(tmp_path):
    config = tmp_path / "config.json"
    llama = '{"model_type": "llama", "vocab_size": 64, "hidden_size": 32, ' \
            '"intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, '
    config.write_text(llama + '"architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(PlannerError, match=r"'GPT2LMHeadModel' is a 'gpt2' model but model_type "
                                           r"is 'llama'; use 'LlamaForCausalLM'"):
        load_model(f"hf:{config}")
    config.write_text(llama + '"architectures": ["LlamaForSequenceClassification"]}')
    with pytest.raises(PlannerError, match=r"lacks; add \"pad_token_id\": 0"):
        load_model(f"hf:{config}")
    config.write_text(llama + '"pad_token_id": 0, "architectures": ["LlamaForSequenceClassification"]}')
    loaded = load_model(f"hf:{config}", micro_batch=3, seq_len=8)
    assert tuple(loaded.target.shape) == (3,) and set(loaded.inputs) == {"input_ids"}
