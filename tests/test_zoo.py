"""The model zoo: published parameter counts, tiny models train and trace, pruning, configs."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from planner.zoo import FAMILIES, PRESETS, make_config, preset_config
from planner.zoo import gpt, llama

# A meta build's CPU on the building thread: 0.35-1.4 s here (gpt3-175b, 2026-11-25, load
# 8), when the wall clock read 3.5-9.2 s: on a shared machine the wall counts the time
# other processes hold the cores, the thread clock does not.
META_BUILD_CPU_S = 30
TINY_PRESETS = ["gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny", "mlp-small", "cnn-small", "dlrm-small"]


def _meta_model(preset: str):
    family, config = preset_config(preset)
    with torch.device("meta"):
        model = FAMILIES[family].build(config)
    return family, config, model


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() dedups tied weights


def _tiny(preset: str, seed: int = 0):
    family, config = preset_config(preset)
    torch.manual_seed(seed)
    return FAMILIES[family], config, FAMILIES[family].build(config)


def test_gpt3_175b_matches_megatron_formula_on_meta():
    start = time.thread_time()
    _, config, model = _meta_model("gpt3-175b")
    assert time.thread_time() - start < META_BUILD_CPU_S  # meta: no memory, little CPU
    l, h, V, s = config.layers, config.hidden, config.vocab, config.seq
    # Narayanan et al. 2021: P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)), plus final LayerNorm 2h.
    megatron = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h)) + 2 * h
    assert _count(model) == round(megatron) == gpt.megatron_parameter_count(config)
    assert _count(model) == pytest.approx(174.6e9, rel=0.005)
    assert next(model.parameters()).device.type == "meta"


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("gpt3-")])
def test_every_gpt3_preset_matches_megatron_formula(preset):
    _, config, model = _meta_model(preset)
    assert config.hidden % config.heads == 0
    assert _count(model) == gpt.megatron_parameter_count(config)


@pytest.mark.parametrize("preset, expected, exact", [
    ("llama3.2-1b", 1.24e9, 1_235_814_400),  # tied head: equals HF meta-llama/Llama-3.2-1B
    ("llama3-8b", 8.03e9, 8_030_261_248),  # equals Hugging Face LlamaForCausalLM
    ("llama3-70b", 70.6e9, 70_553_706_496),
    ("llama3-405b", 405.9e9, 405_853_388_800),
    ("bert-large", 335.2e6, 335_174_458),  # MLM head, no pooler: equals HF BertForMaskedLM
    ("t5-large", 737.7e6, 737_668_096),  # tied head (T5 v1.0): equals HF T5ForConditionalGeneration
])
def test_published_parameter_counts(preset, expected, exact):
    start = time.thread_time()
    _, _, model = _meta_model(preset)
    assert time.thread_time() - start < META_BUILD_CPU_S
    assert _count(model) == pytest.approx(expected, rel=0.01)
    assert _count(model) == exact


def test_bert_and_t5_counts_in_published_ranges():
    assert 335e6 <= _count(_meta_model("bert-large")[2]) <= 340e6
    assert 737e6 <= _count(_meta_model("t5-large")[2]) <= 738e6


def test_dlrm_large_tables_are_multi_gigabyte():
    _, config, model = _meta_model("dlrm-large")
    table_bytes = sum(t.weight.numel() * 4 for t in model.tables.values())  # fp32
    assert table_bytes > 10e9 and config.num_tables == len(model.tables)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_preset_trains_on_cpu(preset):
    family, config, model = _tiny(preset)
    generator = torch.Generator().manual_seed(1)
    inputs, target = family.example_inputs(config, micro_batch=2, generator=generator)
    loss = family.loss_fn(model(**inputs), target)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_tiny_preset_fx_trace_matches_eager(preset):
    family, config, model = _tiny(preset)
    model.eval()  # no dropout, BatchNorm uses running stats
    inputs, _ = family.example_inputs(config, micro_batch=2, generator=torch.Generator().manual_seed(2))
    traced = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(traced(**inputs), model(**inputs), rtol=0, atol=0)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_meta_model_runs_on_meta_inputs(preset):
    family_name, config, model = _meta_model(preset)
    family = FAMILIES[family_name]
    inputs, target = family.example_inputs(config, micro_batch=3, device="meta")
    assert all(t.device.type == "meta" for t in [*inputs.values(), target])
    output = model(**inputs)
    assert output.device.type == "meta" and output.shape[0] == 3
    assert family.loss_fn(output, target).shape == ()
    seq = family.seq_len(config)
    if seq is not None:
        assert output.shape[:2] == (3, seq)


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_init_and_inputs_are_deterministic(preset):
    family, config, first = _tiny(preset, seed=7)
    _, _, second = _tiny(preset, seed=7)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    inputs_a, target_a = family.example_inputs(config, 2, generator=torch.Generator().manual_seed(3))
    inputs_b, target_b = family.example_inputs(config, 2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(target_a, target_b)
    assert all(torch.equal(inputs_a[k], inputs_b[k]) for k in inputs_a)


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny"])
def test_pruned_stages_compose_to_the_full_model(preset):
    family, config, model = _tiny(preset)
    model.eval()
    inputs, _ = family.example_inputs(config, micro_batch=2, generator=torch.Generator().manual_seed(4))
    half = config.layers // 2
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    for name in [str(i) for i in range(half, config.layers)]:
        del first.blocks[name]
    first.norm, first.head = None, None
    for name in [str(i) for i in range(half)]:
        del second.blocks[name]
    second.embed = None
    assert list(second.blocks.keys()) == [str(i) for i in range(half, config.layers)]

    with torch.no_grad():
        hidden = model.embed(inputs["input_ids"])  # (B, T, h): the full model's own first half
        for name in [str(i) for i in range(half)]:
            hidden = model.blocks[name](hidden)
        expected = hidden
        for name in [str(i) for i in range(half, config.layers)]:
            expected = model.blocks[name](expected)
        expected = model.head(model.norm(expected))
        torch.testing.assert_close(first(**inputs), hidden, rtol=0, atol=0)
        torch.testing.assert_close(second(input_ids=hidden), expected, rtol=0, atol=0)
        torch.testing.assert_close(second(input_ids=first(**inputs)), model(**inputs))
    torch.fx.symbolic_trace(second)  # a pruned stage still traces


@pytest.mark.parametrize("module, config", [
    (gpt, gpt.Config(heads=4)),
    (llama, llama.Config(heads=8, kv_heads=4)),
])
def test_attention_runs_on_a_tensor_parallel_shard(module, config):
    """Megatron split: columns of q/k/v by head, rows of the output; shard outputs sum to the full."""
    torch.manual_seed(0)
    attn = module.build(config).blocks["0"].attn.eval()
    x = torch.randn(2, 8, config.hidden)
    names = [n for n in ("q", "k", "v", "o", "proj") if hasattr(attn, n)]
    out_name = "o" if hasattr(attn, "o") else "proj"
    total = 0
    for rank in range(2):
        shard = copy.deepcopy(attn)
        for name in names:
            linear = getattr(shard, name)
            dim = 1 if name == out_name else 0
            size = linear.weight.shape[dim] // 2
            linear.weight = torch.nn.Parameter(linear.weight.narrow(dim, rank * size, size))
            if linear.bias is not None:
                bias = linear.bias if dim == 0 else linear.bias / 2  # row-parallel bias added once
                linear.bias = torch.nn.Parameter(bias.narrow(0, rank * size, size) if dim == 0 else bias)
        total = total + shard(x)
    torch.testing.assert_close(total, attn(x), rtol=1e-5, atol=1e-6)


def test_tied_and_untied_heads():
    _, _, g = _tiny("gpt-tiny")
    assert g.head.weight is g.embed.tok.weight
    _, _, l = _tiny("llama-tiny")
    assert l.head.weight is not l.embed.weight
    _, _, b = _tiny("bert-tiny")
    assert b.head.decoder.weight is b.embed.word.weight
    _, _, t = _tiny("t5-tiny")
    assert t.head.weight is t.embed.tok.weight is t.decoder_embed.tok.weight


def test_seq_len_override():
    config = gpt.Config(seq=32)
    inputs, labels = gpt.example_inputs(config, 2, seq_len=16)
    assert inputs["input_ids"].shape == labels.shape == (2, 16)
    assert gpt.build(config)(**inputs).shape == (2, 16, config.vocab)
    with pytest.raises(ValueError, match="seq_len=64 exceeds the learned position table"):
        gpt.example_inputs(config, 2, seq_len=64)
    with pytest.raises(ValueError, match="seq_len=600"):
        FAMILIES["bert"].example_inputs(preset_config("bert-large")[1], 1, seq_len=600, device="meta")
    inputs, _ = llama.example_inputs(llama.Config(seq=32), 1, seq_len=64)  # RoPE: any length
    assert inputs["input_ids"].shape == (1, 64)
    assert FAMILIES["mlp"].example_inputs(FAMILIES["mlp"].Config(), 2, seq_len=999)[0]["x"].shape[0] == 2


def test_make_config_parses_strings():
    config = make_config("gpt", {"layers": "2", "hidden": "64", "dropout": "0.0", "bias": "false",
                                 "tie_embeddings": "True"})
    assert (config.layers, config.hidden, config.dropout, config.bias, config.tie_embeddings) == (
        2, 64, 0.0, False, True)
    assert make_config("llama", {"rope_theta": "1e4"}).rope_theta == 10000.0
    assert make_config("dlrm", {"bottom_mlp": "512-256", "top_mlp": (8,)}).bottom_mlp == (512, 256)
    assert make_config("mlp", {}) == FAMILIES["mlp"].Config()
    assert gpt.Config(hidden=64).ffn_size == 256


def test_make_config_rejects_bad_fields_and_values():
    with pytest.raises(ValueError, match=r"unknown config field 'hiden'.*valid fields: layers, hidden"):
        make_config("gpt", {"hiden": "64"})
    with pytest.raises(ValueError, match="expected an integer"):
        make_config("gpt", {"layers": "two"})
    with pytest.raises(ValueError, match="expected true/false"):
        make_config("gpt", {"bias": "maybe"})
    with pytest.raises(ValueError, match="not divisible by heads"):
        make_config("gpt", {"hidden": "60", "heads": "8"})
    with pytest.raises(ValueError, match="known families: gpt, llama"):
        make_config("resnet", {})


def test_preset_config():
    family, config = preset_config("gpt3-13b")
    assert family == "gpt" and (config.layers, config.hidden, config.heads) == (40, 5120, 40)
    family, config = preset_config("llama3-70b", {"layers": "2"})
    assert family == "llama" and config.layers == 2 and config.kv_heads == 8
    with pytest.raises(ValueError, match=r"unknown preset 'gpt4'; known presets: .*gpt3-175b.*dlrm-small"):
        preset_config("gpt4")
    for name in TINY_PRESETS:
        family, config = preset_config(name)
        for field in ("heads", "kv_heads"):
            if hasattr(config, field):
                assert getattr(config, field) % 4 == 0, (name, field)
