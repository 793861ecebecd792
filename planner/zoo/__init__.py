"""The model zoo: reference models that are inputs to the planner.

Each family module (gpt, llama, bert, t5, mlp, cnn, dlrm) exposes the same interface:

    Config                      frozen dataclass; the defaults are a tiny model
    build(config)               -> nn.Module (works under `with torch.device("meta")`)
    example_inputs(config, micro_batch, seq_len=None, device="cpu", generator=None)
                                -> (forward kwargs, target)
    loss_fn(output, target)     -> scalar mean loss
    seq_len(config)             -> int | None

Models follow the rules the tracer and executor rely on: top-level modules in execution
order, repeated blocks in an `nn.ModuleDict` keyed "0", "1", ..., forward returns the
output (not the loss), `torch.fx.symbolic_trace` works, and pipeline stages are made by
setting top-level modules to None and deleting blocks.

    >>> family, config = preset_config("gpt3-1.3b")
    >>> with torch.device("meta"):
    ...     model = FAMILIES[family].build(config)
    >>> make_config("gpt", {"layers": "2", "hidden": "64"})
"""

from __future__ import annotations

import dataclasses
import re
import typing
from types import ModuleType

from planner.zoo import bert, cnn, dlrm, gpt, llama, mlp, t5

FAMILIES: dict[str, ModuleType] = {
    "gpt": gpt, "llama": llama, "bert": bert, "t5": t5, "mlp": mlp, "cnn": cnn, "dlrm": dlrm,
}


def _gpt3(layers: int, hidden: int, heads: int) -> tuple[str, dict]:
    # Brown et al. 2020, Table 2.1; vocab padded to 51200 as Megatron does, context 2048.
    return "gpt", {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 51200, "seq": 2048}


def _llama3(layers: int, hidden: int, heads: int, ffn: int) -> tuple[str, dict]:
    # Meta's Llama 3 / 3.1 params.json: GQA with 8 kv heads, 128256 tokens, theta 500000.
    # seq 8192 is Llama 3's pre-training context (3.1 extends it to 128K in a later phase).
    return "llama", {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": 8, "ffn": ffn,
                     "vocab": 128256, "seq": 8192, "rope_theta": 500000.0, "norm_eps": 1e-5}


PRESETS: dict[str, tuple[str, dict]] = {
    "gpt3-125m": _gpt3(12, 768, 12),
    "gpt3-350m": _gpt3(24, 1024, 16),
    "gpt3-760m": _gpt3(24, 1536, 16),
    "gpt3-1.3b": _gpt3(24, 2048, 16),  # paper: 24 heads, which do not divide 2048; 16 keeps d_head 128
    "gpt3-2.7b": _gpt3(32, 2560, 32),
    "gpt3-6.7b": _gpt3(32, 4096, 32),
    # Paper: d_model 5140, which 40 heads do not divide; we read it as a typo for 40 x 128 =
    # 5120 (what Megatron and OPT-13B use) rather than take 20 heads of width 257.
    "gpt3-13b": _gpt3(40, 5120, 40),
    "gpt3-175b": _gpt3(96, 12288, 96),
    # Llama 3.2 1B (params.json: ffn 2048 x 4 x 2/3 x 1.5 rounded up to 256s; tied head).
    "llama3.2-1b": ("llama", {**_llama3(16, 2048, 32, 8192)[1], "tie_embeddings": True}),
    "llama3-8b": _llama3(32, 4096, 32, 14336),
    "llama3-70b": _llama3(80, 8192, 64, 28672),
    "llama3-405b": _llama3(126, 16384, 128, 53248),
    # Devlin et al. 2019; with the MLM head and no pooler: 335.2M parameters.
    "bert-large": ("bert", {"layers": 24, "hidden": 1024, "heads": 16, "ffn": 4096, "vocab": 30522,
                            "seq": 512}),
    # Raffel et al. 2020 (T5 v1.0 "large", tied head): 737.7M parameters.
    "t5-large": ("t5", {"layers": 24, "decoder_layers": 24, "d_model": 1024, "d_kv": 64, "heads": 16,
                        "d_ff": 4096, "vocab": 32128, "seq": 512}),
    # MLPerf DLRM widths, Criteo's 13 dense / 26 sparse features with one id each; 26 tables of
    # 2M x 128 rows are 6.7B parameters, 26.6 GB in fp32: too big to replicate on most GPUs.
    "dlrm-large": ("dlrm", {"num_tables": 26, "rows_per_table": 2_000_000, "embedding_dim": 128,
                            "dense_features": 13, "bottom_mlp": (512, 256),
                            "top_mlp": (1024, 1024, 512, 256), "lookups_per_table": 1}),
    # Criteo Terabyte at MLPerf DLRM scale: the 26 table sizes (ids capped at 40M) that
    # TorchRec's MLPerf DLRM example passes as --num_embeddings_per_feature
    # (torchrec/examples/dlrm, README), one id per table per sample (one-hot Criteo),
    # MLPerf widths. 204M rows x 128 fp32: 104.6 GB of tables.
    "dlrm-criteo-tb": ("dlrm", {"num_tables": 26, "rows_per_table": 40_000_000, "embedding_dim": 128,
                                "table_rows": (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543,
                                               63, 40000000, 3067956, 405282, 10, 2209, 11938,
                                               155, 4, 976, 14, 40000000, 40000000, 40000000,
                                               590152, 12973, 108, 36),
                                "dense_features": 13, "bottom_mlp": (512, 256),
                                "top_mlp": (1024, 1024, 512, 256), "lookups_per_table": 1}),
    # Tiny models for tests: forward + backward on CPU in milliseconds, heads divisible by 4.
    "gpt-tiny": ("gpt", {"layers": 4, "hidden": 64, "heads": 4, "vocab": 128, "seq": 32}),
    "llama-tiny": ("llama", {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 160,
                             "vocab": 128, "seq": 32}),
    "bert-tiny": ("bert", {"layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 128, "seq": 32}),
    "t5-tiny": ("t5", {"layers": 2, "decoder_layers": 2, "d_model": 64, "d_kv": 16, "heads": 4,
                       "d_ff": 128, "vocab": 128, "seq": 32}),
    "mlp-small": ("mlp", {"layers": 4, "width": 64, "in_features": 32, "out_features": 10}),
    "cnn-small": ("cnn", {"channels": 16, "blocks": 2, "image_size": 16, "num_classes": 10}),
    "dlrm-small": ("dlrm", {"num_tables": 4, "rows_per_table": 100, "embedding_dim": 16}),
}

_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _convert(family: str, name: str, value, kind):
    """`value` as the field type `kind` (int, float, bool, str or tuple[int, ...])."""
    where = f"{family}.{name}"
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ValueError(f"{where}: expected true/false, got {value!r}")
    if kind is int:
        return _to_int(where, value)
    if kind is float:
        if isinstance(value, bool):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected a number, got {value!r}") from None
    if typing.get_origin(kind) is tuple:
        if isinstance(value, str):  # "512-256", "512x256", "512:256", "512,256"
            items = re.split(r"[-x:,\s]+", value.strip())
        else:
            items = list(value) if isinstance(value, (tuple, list)) else [value]
        return tuple(_to_int(where, item) for item in items if item != "")
    return str(value)


def _to_int(where: str, value) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        number = float(str(value).strip().replace("_", ""))  # "96", "1e6", "2_000_000"
    except ValueError:
        raise ValueError(f"{where}: expected an integer, got {value!r}") from None
    if not number.is_integer():
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    return int(number)


def make_config(family: str, overrides: dict[str, str | int | float | bool] | None = None):
    """The family's Config with `overrides` (strings converted by the field types)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; known families: {', '.join(FAMILIES)}")
    config_cls = FAMILIES[family].Config
    types = typing.get_type_hints(config_cls)
    names = [f.name for f in dataclasses.fields(config_cls)]
    kwargs = {}
    for name, value in (overrides or {}).items():
        if name not in types:
            raise ValueError(f"{family}: unknown config field {name!r}; use one of the valid fields: {', '.join(names)}")
        kwargs[name] = _convert(family, name, value, types[name])
    return config_cls(**kwargs)


def preset_config(name: str, overrides: dict[str, str | int | float | bool] | None = None):
    """(family, Config) of a named preset, optionally with fields overridden."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    family, fields = PRESETS[name]
    return family, make_config(family, {**fields, **(overrides or {})})


__all__ = ["FAMILIES", "PRESETS", "make_config", "preset_config",
           "bert", "cnn", "dlrm", "gpt", "llama", "mlp", "t5"]
