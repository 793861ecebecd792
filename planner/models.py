"""Turn a MODEL argument into a module, example inputs, target and loss — on meta by default.

MODEL is one of
  - a preset name:                 `gpt3-175b`, `llama3-8b`, `bert-large`, `gpt-tiny`, ...
  - a family with overrides:       `gpt:layers=96,hidden=12288,heads=96,vocab=51200,seq=2048`
  - a factory:                     `package.module:factory` — called as
                                   `factory(micro_batch=, seq_len=, device=)` and returning
                                   `(module, inputs: dict, target, loss_fn)`
  - a Hugging Face config:         `hf:path/to/config.json` (random init, no download); the
                                   head is the config's `architectures[0]`, else the model
                                   type's default (seq2seq, masked or causal LM, image
                                   classification); inputs and loss follow the head's task
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.safe_json import read_json
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
            raise PlannerError(f"model {spec!r}: override {item!r} is not key=value; write "
                               "e.g. gpt:layers=24,hidden=1024")
        key, value = item.split("=", 1)
        key = key.strip()
        if key in out:
            raise PlannerError(f"model {spec!r}: {key!r} is given twice ({key}={out[key]} and "
                               f"{key}={value.strip()}); keep one")
        out[key] = value.strip()
    return out


def resolve_config(spec: str) -> tuple[str, Any, str]:
    """(family, config, display name) for a preset or `family:overrides` spec."""
    if ":" in spec:
        family, rest = spec.split(":", 1)
        if family not in zoo.FAMILIES:
            raise PlannerError(f"model {spec!r}: unknown model family {family!r}; use one of "
                               f"{', '.join(zoo.FAMILIES)}, or package.module:function for a "
                               "factory")
        overrides = parse_overrides(rest, spec)
        try:
            config = zoo.make_config(family, overrides)
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            raise PlannerError(f"model {spec!r}: {exc}") from None
        _check_sizes(spec, config, overrides)
        return family, config, spec
    try:
        family, config = zoo.preset_config(spec)
    except (ValueError, KeyError) as exc:
        raise PlannerError(f"unknown model {spec!r}: {exc}; use a preset, family:key=value, "
                           "package.module:function or hf:config.json") from None
    return family, config, spec


# Largest whole number a `family:key=value` override may give (rows of an embedding
# table, the biggest figure the zoo uses, are 2M): beyond it a value is a typo.
MAX_OVERRIDE = 2**26


def _check_sizes(spec: str, config, overrides: dict[str, str]) -> None:
    """Overridden sizes are whole numbers in [0, MAX_OVERRIDE] and rates finite."""
    import math

    for key in overrides:
        value = getattr(config, key, None)
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, bool):
                continue
            if isinstance(v, int) and not 0 <= v <= MAX_OVERRIDE:
                raise PlannerError(f"model {spec!r}: {key}={overrides[key]} is out of range; "
                                   f"use a whole number from 0 to {MAX_OVERRIDE:,}")
            if isinstance(v, float) and not math.isfinite(v):
                raise PlannerError(f"model {spec!r}: {key}={overrides[key]} is not a finite "
                                   "number")


def load_model(spec: str, micro_batch: int = 1, seq_len: int | None = None,
               device: str = "meta", seed: int | None = None) -> LoadedModel:
    """Build the model named by `spec` (on meta: no memory) with example inputs."""
    if micro_batch < 1:
        raise PlannerError(f"--micro-batch must be >= 1, got {micro_batch}")
    if spec.startswith("hf:"):
        return _load_hf(spec[3:], micro_batch, seq_len, device, seed)
    if is_factory_spec(spec):
        return _load_factory(spec, micro_batch, seq_len, device, seed)
    family, config, name = resolve_config(spec)
    fam = zoo.FAMILIES[family]
    if seed is not None:
        torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    try:
        with torch.device(device):
            module = fam.build(config)
        inputs, target = fam.example_inputs(config, micro_batch, seq_len, device=device,
                                            generator=gen)
    except ValueError as exc:
        raise PlannerError(f"model {spec!r}: {exc}") from None
    except (RuntimeError, ZeroDivisionError, OverflowError, TypeError) as exc:
        raise PlannerError(f"model {spec!r} cannot be built with these sizes "
                           f"({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}); "
                           "check the overrides") from exc
    return LoadedModel(name, module, inputs, target, fam.loss_fn, family, config)


def example_batch(spec: str, micro_batch: int = 1, seq_len: int | None = None,
                  seed: int | None = None) -> tuple[dict[str, torch.Tensor], Any]:
    """`load_model(spec, ..., device="cpu", seed=seed)`'s (inputs, target), without
    materializing the weights: a zoo family draws them from its config, a Hugging Face
    model from its config and a meta build (both from their own generator, so the values
    are the same); a factory is code, called on the CPU as `load_model` calls it."""
    if micro_batch < 1:
        raise PlannerError(f"--micro-batch must be >= 1, got {micro_batch}")
    if is_factory_spec(spec):
        loaded = load_model(spec, micro_batch, seq_len, device="cpu", seed=seed)
        return loaded.inputs, loaded.target
    if spec.startswith("hf:"):
        model_type, raw, config = _read_hf_config(spec[3:])
        cls, task = _hf_head_class(spec[3:], model_type, raw)
        meta = load_model(spec, micro_batch, seq_len, device="meta").module
        gen = torch.Generator().manual_seed(seed if seed is not None else 0)
        inputs, target, _ = _hf_example(task, config, micro_batch, seq_len, "cpu", gen,
                                        spec[3:], _position_offset(meta))
        return inputs, target
    family, config, _ = resolve_config(spec)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    try:
        return zoo.FAMILIES[family].example_inputs(config, micro_batch, seq_len, device="cpu",
                                                   generator=gen)
    except ValueError as exc:
        raise PlannerError(f"model {spec!r}: {exc}") from None


def is_factory_spec(spec: str) -> bool:
    """`package.module:function`: code, which only a MODEL the user types may name."""
    head = spec.split(":", 1)[0]
    return ":" in spec and not spec.startswith("hf:") and head not in zoo.FAMILIES and "." in head


def _load_factory(spec: str, micro_batch: int, seq_len: int | None, device: str,
                  seed: int | None) -> LoadedModel:
    module_name, attr = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the user's project is importable
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PlannerError(f"model {spec!r}: cannot import {attr!r} from {module_name!r} "
                           f"({exc}); check the module is on PYTHONPATH") from None
    if seed is not None:
        torch.manual_seed(seed)  # the factory's init and draws repeat on every rank
    _check_factory(spec, factory)
    try:
        result = factory(micro_batch=micro_batch, seq_len=seq_len, device=device)
    except PlannerError:
        raise
    except Exception as exc:  # the factory is the user's code: name it, keep the cause
        raise PlannerError(f"model {spec!r}: the factory raised {type(exc).__name__}: "
                           f"{str(exc)[:200]} (rerun with --debug for the traceback)") from exc
    if not (isinstance(result, tuple) and len(result) == 4 and isinstance(result[0], nn.Module)):
        raise PlannerError(f"model {spec!r}: the factory must return (module, inputs, target, "
                           f"loss_fn), got {type(result).__name__}")
    module, inputs, target, loss_fn = result
    return LoadedModel(spec, module, dict(inputs), target, loss_fn, "factory")


FACTORY_SIGNATURE = ("name a function(micro_batch=, seq_len=, device=) that returns "
                     "(module, inputs, target, loss_fn)")


def _check_factory(spec: str, factory) -> None:
    """Refuse what is not a factory (a class, a module, `os.path:join`) before calling it."""
    import inspect

    if isinstance(factory, type) or not callable(factory):
        what = "a class" if isinstance(factory, type) else f"a {type(factory).__name__}"
        raise PlannerError(f"model {spec!r} names {what}, not a factory; {FACTORY_SIGNATURE}")
    try:
        inspect.signature(factory).bind(micro_batch=1, seq_len=None, device="meta")
    except TypeError as exc:
        raise PlannerError(f"model {spec!r}: cannot be called as a factory ({exc}); "
                           f"{FACTORY_SIGNATURE}") from None
    except ValueError:  # a builtin without a signature: let the call decide
        pass


# Heads planner can train, by the transformers auto-mapping that lists the class: the task
# decides the example inputs and the loss. Order matters for the default (no
# "architectures" in the config): the first mapping that knows the model type wins, so
# encoder-decoders get their seq2seq head (Whisper not WhisperForCausalLM) and encoders
# their masked-LM head (BERT not BertLMHeadModel).
_HF_TASKS = (
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("sequence-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
)
# A transformers config.json is a few KiB; the largest with tokenizer tables inlined ~1 MiB.
HF_CONFIG_MAX_BYTES = 16 * 2**20
# Sequence length of the example token ids when --seq-len is not given (capped by the
# model's positions): long enough to exercise attention, small enough to trace fast.
HF_DEFAULT_SEQ_LEN = 128
# Positions assumed for a config that states none (BERT's classic limit).
HF_FALLBACK_POSITIONS = 512


def _hf_mappings() -> list[tuple[str, dict[str, str]]]:
    from transformers.models.auto import modeling_auto

    return [(task, getattr(modeling_auto, attr)) for task, attr in _HF_TASKS]


def _hf_task_of_class(class_name: str) -> str | None:
    for task, mapping in _hf_mappings():
        for value in mapping.values():
            if class_name in ((value,) if isinstance(value, str) else value):
                return task
    return None


def _default_head(model_type: str) -> tuple[str, str] | None:
    """(class name, task) of the first trainable head transformers maps `model_type` to."""
    for task, mapping in _hf_mappings():
        if model_type in mapping:
            return mapping[model_type], task
    return None


def _hf_head_class(path: str, model_type: str, raw: dict):
    """(model class, task): the config's `architectures[0]`, else the default head."""
    import transformers

    archs = raw.get("architectures")
    default = _default_head(model_type)
    supported = ", ".join(task for task, _ in _HF_TASKS)
    instead = (f"use {default[0]!r} (the default for {model_type!r})" if default
               else f"name a head class for {supported}")
    if archs:
        if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
            raise PlannerError(f"hf config {path!r}: 'architectures' must be a list of class "
                               f"names (e.g. [\"LlamaForCausalLM\"]), got {archs!r}")
        name = archs[0]
        cls = getattr(transformers, name, None)
        if not isinstance(cls, type):
            raise PlannerError(f"hf config {path!r}: architectures[0] {name!r} is not a class "
                               f"of transformers {transformers.__version__}; {instead}")
        config_class = getattr(cls, "config_class", None)
        if config_class is not None and getattr(config_class, "model_type", model_type) != model_type:
            raise PlannerError(f"hf config {path!r}: architectures[0] {name!r} is a "
                               f"{config_class.model_type!r} model but model_type is "
                               f"{model_type!r}; {instead}")
        task = _hf_task_of_class(name)
        if task is None:
            raise PlannerError(f"hf config {path!r}: architectures[0] {name!r} has no loss "
                               f"planner can train ({supported}); {instead}")
        return cls, task
    if default is None:
        raise PlannerError(f"hf config {path!r}: transformers has no trainable head for "
                           f"model_type {model_type!r} ({supported}); add \"architectures\": "
                           "[\"<HeadClass>\"]")
    return getattr(transformers, default[0]), default[1]


def _read_hf_config(path: str):
    """(model_type, raw dict, transformers config) of a config.json, errors naming the
    file; the file is checked before transformers (seconds to import) is."""
    fix = "give a transformers config.json (an object with \"model_type\")"
    raw = read_json(path, "hf config", fix, max_bytes=HF_CONFIG_MAX_BYTES)
    if not isinstance(raw, dict):
        raise PlannerError(f"hf config {path!r} is a JSON {type(raw).__name__}, not an object; "
                           f"{fix}")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) and model_type:
        raise PlannerError(f"hf config {path!r}: model_type must be a string such as \"gpt2\", "
                           f"got {model_type!r:.60}")
    if not model_type:
        raise PlannerError(f"hf config {path!r} has no 'model_type': add one (e.g. \"gpt2\", "
                           "\"llama\")")
    try:
        import transformers
    except ImportError:
        raise PlannerError("hf: models need the transformers package: pip install "
                           "'planner[dev]' (or transformers)") from None
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    try:
        config = transformers.AutoConfig.for_model(model_type, **fields)
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise PlannerError(f"hf config {path!r}: {(str(exc).splitlines() or [''])[0][:200]}") \
            from None
    return model_type, raw, config


def _load_hf(path: str, micro_batch: int, seq_len: int | None, device: str,
             seed: int | None) -> LoadedModel:
    model_type, raw, config = _read_hf_config(path)
    cls, task = _hf_head_class(path, model_type, raw)
    config.use_cache = False  # export cannot trace the KV cache
    if task == "sequence-classification" and getattr(config, "pad_token_id", None) is None:
        raise PlannerError(f"hf config {path!r}: {cls.__name__} finds each sample's last token "
                           "by its pad_token_id, which the config lacks; add \"pad_token_id\": 0")
    if seed is not None:
        torch.manual_seed(seed)
    try:
        with torch.device(device):
            module = cls._from_config(config, attn_implementation="eager")
    except (ValueError, TypeError, AttributeError) as exc:
        raise PlannerError(f"hf config {path!r}: transformers cannot build {cls.__name__} from "
                           f"it: {str(exc).splitlines()[0][:200]}") from None
    gen = torch.Generator().manual_seed(seed if seed is not None else 0)
    inputs, target, loss_fn = _hf_example(task, config, micro_batch, seq_len, device, gen, path,
                                          _position_offset(module))
    folder = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    return LoadedModel(f"hf:{folder}:{cls.__name__}", module, inputs, target, loss_fn, "hf",
                       config)


def _on(t: torch.Tensor, device: str) -> torch.Tensor:
    """`t` (drawn on CPU, so values do not depend on the device) moved to `device`."""
    return torch.empty_like(t, device="meta") if device == "meta" else t.to(device)


def _positions(config, *names: str) -> int:
    for n in names:
        value = getattr(config, n, None)
        if isinstance(value, int) and value > 0:
            return value
    return HF_FALLBACK_POSITIONS


def _position_offset(module: nn.Module) -> int:
    """Positions a model reserves before the first token: RoBERTa-style position embeddings
    number tokens from padding_idx + 1, so they hold that many fewer tokens."""
    for name, m in module.named_modules():
        if name.endswith("position_embeddings") and isinstance(m, nn.Embedding) \
                and m.padding_idx is not None:
            return m.padding_idx + 1
    return 0


def _hf_example(task: str, config, micro_batch: int, seq_len: int | None, device: str, gen,
                path: str, position_offset: int = 0):
    """(inputs, target, loss_fn) of one micro-batch for a head of `task`."""
    if task == "image-classification":
        size = config.image_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        pixels = torch.randn(micro_batch, config.num_channels, h, w, generator=gen)  # (B, C, H, W)
        labels = torch.randint(0, config.num_labels, (micro_batch,), generator=gen)  # (B,)
        return {"pixel_values": _on(pixels, device)}, _on(labels, device), classification_loss
    if task == "speech-seq2seq":
        # Whisper's encoder takes exactly 2 x max_source_positions frames (its conv stride).
        frames = 2 * config.max_source_positions
        feats = torch.randn(micro_batch, config.num_mel_bins, frames, generator=gen)  # (B, mel, F)
        max_pos = _positions(config, "max_target_positions")
    else:
        max_pos = _positions(config, "n_positions", "max_position_embeddings") - position_offset
    seq = seq_len or min(max_pos, HF_DEFAULT_SEQ_LEN)
    if seq > max_pos:
        raise PlannerError(f"hf config {path!r}: --seq-len {seq} exceeds the model's {max_pos} "
                           "positions")
    vocab = int(config.vocab_size)

    def ids():
        return _on(torch.randint(0, vocab, (micro_batch, seq), generator=gen), device)  # (B, T)

    if task == "speech-seq2seq":
        return {"input_features": _on(feats, device), "decoder_input_ids": ids()}, ids(), lm_loss
    inputs = {"input_ids": ids()}
    if task == "seq2seq-lm":
        inputs["decoder_input_ids"] = ids()
    if task == "sequence-classification":
        labels = torch.randint(0, config.num_labels, (micro_batch,), generator=gen)  # (B,)
        return inputs, _on(labels, device), classification_loss
    return inputs, ids(), lm_loss


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy of one label per sample: logits (B, classes), labels (B,)."""
    return F.cross_entropy(logits, labels)


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
    ids = loaded.inputs.get("input_ids", loaded.inputs.get("decoder_input_ids"))
    return int(ids.shape[1]) if ids is not None and ids.dim() >= 2 else seq_len


# The key of a plan file's search block saying the plan was priced for a model built on
# meta (`planner plan --meta-init`): `estimate --plan` and `validate` run and price it so.
META_INIT_KEY = "meta_init"


def planned_on_meta(doc) -> bool:
    """Whether plan document `doc` was made for a model built under `executors.meta_init`."""
    return doc.search.get(META_INIT_KEY) is True


def executor_model(spec: str, graph: LayerGraph) -> nn.Module:
    """The module `executors.apply` gets when the model is built under
    `executors.meta_init`: `spec` built on meta, at the IR's shape. Only its build and
    layout are read (`cost_models.common.model_layer_configs`), never its values."""
    return load_model(spec, graph.micro_batch, graph.seq_len, device="meta").module


def graph_for_plan(doc, spec: str | None = None) -> LayerGraph:
    """The layer IR a plan file was made for, rebuilt from the shape it records, and
    checked against its fingerprint."""
    dtype = getattr(torch, doc.graph_dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise PlannerError(f"plan records an unknown IR dtype {doc.graph_dtype!r:.40} (model."
                           "graph_dtype); re-plan with `planner plan MODEL --out FILE`")
    graph = load_layer_graph(plan_model_spec(doc, spec), doc.graph_micro_batch, doc.seq_len,
                             dtype)
    doc.check_model(graph)
    return graph


def plan_model_spec(doc, given: str | None = None) -> str:
    """The MODEL that rebuilds a plan's model: `given` (typed by the user), else the spec
    the plan records (its name in plans written before specs were). A plan is data: a
    factory it names is never imported unless the user passes it as MODEL."""
    if given:
        return given
    recorded = doc.model_spec or doc.model_name
    if is_factory_spec(recorded):
        raise PlannerError(f"the plan names the factory {recorded!r}, which is code, and a plan "
                           "file never runs code: pass the factory yourself as the model "
                           f"(--model {recorded}) if you trust it")
    if doc.model_spec:
        return doc.model_spec
    if doc.model_name.startswith("hf:") or doc.search.get("made_by") == "auto_parallel":
        raise PlannerError(f"the plan for {doc.model_name} records no model spec to rebuild it "
                           "from: pass MODEL (e.g. hf:path/config.json) or re-plan with "
                           "`planner plan MODEL --out FILE`")
    return doc.model_name


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise PlannerError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None
