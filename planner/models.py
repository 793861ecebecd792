"""Turn a MODEL argument into a module, example inputs, target and loss — on meta by default.

MODEL is one of
  - a preset name:                 `gpt3-175b`, `llama3-8b`, `bert-large`, `gpt-tiny`, ...
  - a family with overrides:       `gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048`
  - a factory:                     `package.module:factory` — called as
                                   `factory(micro_batch=, seq_len=, device=)` and returning
                                   `(module, inputs: dict, target, loss_fn)`
  - a Hugging Face config:         `hf:path/to/config.json` (random init, no download)
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ir.errors import PlannerError
from ir.layer import LayerGraph
from planner import zoo
from planner.zoo._common import lm_loss


@dataclass
class LoadedModel:
    name: str
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    target: torch.Tensor | None
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]
    family: str  # zoo family, "hf" or "factory"
    config: Any = None


def parse_overrides(text: str, spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in item:
            raise PlannerError(f"model {spec!r}: override {item!r} is not key=value "
                               "(e.g. gpt:layers=24,hidden=1024)")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def resolve_config(spec: str) -> tuple[str, Any, str]:
    """(family, config, display name) for a preset or `family:overrides` spec."""
    if ":" in spec:
        family, rest = spec.split(":", 1)
        try:
            return family, zoo.make_config(family, parse_overrides(rest, spec)), spec
        except (ValueError, KeyError) as exc:
            raise PlannerError(f"model {spec!r}: {exc}") from None
    try:
        family, config = zoo.preset_config(spec)
    except (ValueError, KeyError) as exc:
        raise PlannerError(f"unknown model {spec!r}: {exc}") from None
    return family, config, spec


def load_model(spec: str, micro_batch: int = 1, seq_len: int | None = None,
               device: str = "meta", seed: int | None = None) -> LoadedModel:
    """Build the model named by `spec` (on meta: no memory) with example inputs."""
    if micro_batch < 1:
        raise PlannerError(f"--micro-batch must be >= 1, got {micro_batch}")
    if spec.startswith("hf:"):
        return _load_hf(spec[3:], micro_batch, seq_len, device, seed)
    head = spec.split(":", 1)[0]
    if ":" in spec and head not in zoo.FAMILIES and "." in head:
        return _load_factory(spec, micro_batch, seq_len, device)
    family, config, name = resolve_config(spec)
    fam = zoo.FAMILIES[family]
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        module = fam.build(config)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    try:
        inputs, target = fam.example_inputs(config, micro_batch, seq_len, device=device,
                                            generator=gen)
    except ValueError as exc:
        raise PlannerError(f"model {spec!r}: {exc}") from None
    return LoadedModel(name, module, inputs, target, fam.loss_fn, family, config)


def _load_factory(spec: str, micro_batch: int, seq_len: int | None, device: str) -> LoadedModel:
    module_name, attr = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the user's project is importable
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PlannerError(f"model {spec!r}: cannot import {attr!r} from {module_name!r} "
                           f"({exc}); check the module is on PYTHONPATH") from None
    result = factory(micro_batch=micro_batch, seq_len=seq_len, device=device)
    if not (isinstance(result, tuple) and len(result) == 4 and isinstance(result[0], nn.Module)):
        raise PlannerError(f"model {spec!r}: the factory must return (module, inputs, target, "
                           f"loss_fn), got {type(result).__name__}")
    module, inputs, target, loss_fn = result
    return LoadedModel(spec, module, dict(inputs), target, loss_fn, "factory")


# Which transformers auto class builds a trainable model for each kind of config.
_HF_SEQ2SEQ_TYPES = {"t5", "mt5", "bart", "mbart", "pegasus", "marian", "umt5"}
_HF_MASKED_TYPES = {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2"}


def _load_hf(path: str, micro_batch: int, seq_len: int | None, device: str,
             seed: int | None) -> LoadedModel:
    try:
        import transformers
    except ImportError:
        raise PlannerError("hf: models need the transformers package: pip install "
                           "'planner[dev]' (or transformers)") from None
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise PlannerError(f"hf config {path!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlannerError(f"hf config {path!r} is not valid JSON: {exc}") from None
    model_type = raw.get("model_type")
    if not model_type:
        raise PlannerError(f"hf config {path!r} has no 'model_type' (e.g. \"gpt2\", \"llama\")")
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError) as exc:
        raise PlannerError(f"hf config {path!r}: {exc}") from None
    config.use_cache = False  # export cannot trace the KV cache
    if model_type in _HF_SEQ2SEQ_TYPES:
        auto = transformers.AutoModelForSeq2SeqLM
    elif model_type in _HF_MASKED_TYPES:
        auto = transformers.AutoModelForMaskedLM
    else:
        auto = transformers.AutoModelForCausalLM
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        module = auto.from_config(config, attn_implementation="eager")
    vocab = int(config.vocab_size)
    max_pos = (getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
               or 512)
    seq = seq_len or min(int(max_pos), 128)
    if seq > int(max_pos):
        raise PlannerError(f"--seq-len {seq} exceeds the model's {max_pos} positions")
    gen = torch.Generator().manual_seed(seed if seed is not None else 0)

    def ids():
        t = torch.randint(0, vocab, (micro_batch, seq), generator=gen)
        return t.to(device) if device != "meta" else torch.empty_like(t, device="meta")

    inputs = {"input_ids": ids()}
    if model_type in _HF_SEQ2SEQ_TYPES:
        inputs["decoder_input_ids"] = ids()
    name = f"hf:{os.path.basename(os.path.dirname(os.path.abspath(path))) or path}:{model_type}"
    return LoadedModel(name, module, inputs, ids(), lm_loss, "hf", config)


def load_layer_graph(spec: str, micro_batch: int = 1, seq_len: int | None = None,
                     dtype: torch.dtype = torch.bfloat16, force_trace: str | None = None,
                     progress=None) -> LayerGraph:
    """The layer IR of `spec`, traced and measured on the meta device."""
    from ir.measure import build_layer_graph

    loaded = load_model(spec, micro_batch, seq_len, device="meta")
    return build_layer_graph(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                             name=loaded.name, dtype=dtype, force_trace=force_trace,
                             seq_len=model_seq_len(loaded, seq_len), progress=progress)


def model_seq_len(loaded: LoadedModel, seq_len: int | None) -> int | None:
    """The sequence length the inputs were built with (None for non-sequence models)."""
    if loaded.family in zoo.FAMILIES:
        family_len = zoo.FAMILIES[loaded.family].seq_len(loaded.config)
        return None if family_len is None else (seq_len or family_len)
    ids = loaded.inputs.get("input_ids")
    return int(ids.shape[1]) if ids is not None and ids.dim() >= 2 else seq_len


def graph_for_plan(doc, spec: str | None = None) -> LayerGraph:
    """The layer IR a plan file was made for, rebuilt from the shape it records, and
    checked against its fingerprint."""
    dtype = getattr(torch, doc.graph_dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise PlannerError(f"plan records an unknown IR dtype {doc.graph_dtype!r}")
    graph = load_layer_graph(spec or doc.model_name, doc.graph_micro_batch, doc.seq_len, dtype)
    doc.check_model(graph)
    return graph


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise PlannerError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None
