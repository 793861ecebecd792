"""Reading a plan file (schema "planner.plan/v1"): validate every key, name the bad one.

A plan file is data: `load_plan` reads it with `ir.safe_json.read_json` (regular files
only, bounded size and depth, finite numbers) and never imports or calls anything.
Every error is one line `FILE: KEY.PATH: what is wrong; how to fix it`.

What a plan file states twice is checked to agree: the rank lists (`stages[i].ranks`,
`pipeline_groups`, `layers[i].tp_groups` / `dp_groups`), each layer's `index` and
`stage`, and the stages' first/last layer names follow from the strategies and the layer
names; a file edited in one place and not the other is refused instead of half-obeyed.
Keys the schema does not know are refused too (a misspelt key would otherwise be
silently ignored).
"""

from __future__ import annotations

import os

from ir.errors import PlannerError
from ir.plan import (PLAN_SCHEMA, ParallelPlan, PlanDocument, layer_groups, pipeline_groups)
from ir.safe_json import read_json
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision, Schedule, Stage

FIX = "re-create it with `planner plan`"
# Sanity bounds: more devices or samples than any cluster runs is an edited file.
MAX_DEVICES = 2**20
MAX_GLOBAL_BATCH = 2**40

TOP_KEYS = ("schema", "model", "cluster", "world_size", "global_batch", "micro_batch",
            "num_microbatches", "schedule", "precision", "optimizer", "virtual_stages",
            "stages", "pipeline_groups", "layers", "predicted", "search")
MODEL_KEYS = ("name", "spec", "fingerprint", "num_layers", "graph_micro_batch", "graph_dtype",
              "seq_len")
STAGE_KEYS = ("stage", "first_layer", "last_layer", "first_layer_name", "last_layer_name",
              "devices", "ranks")
LAYER_KEYS = ("index", "name", "params", "digest", "stage", "tp", "dp", "dp_mode",
              "sequence_parallel", "checkpoint", "offload", "tp_groups", "dp_groups")


class _Reader:
    """Typed access to a JSON object that names the file and key path in every error."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, what: str):
        raise PlannerError(f"{self.source}: {where}: {what}")

    def object(self, value, where: str, keys: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected a JSON object, got {_json_type(value)}; {FIX}")
        unknown = [k for k in value if k not in keys]
        if unknown:
            self.fail(f"{where}.{unknown[0]}" if where != "top level" else unknown[0],
                      f"unknown key; a {PLAN_SCHEMA} file has only {', '.join(keys)} here "
                      "(remove it)")
        return value

    def get(self, obj: dict, key: str, kind, where: str, low: int | None = None,
            high: int | None = None):
        path = f"{where}.{key}" if where else key
        if key not in obj:
            self.fail(path, f"missing; {FIX}")
        value = obj[key]
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(path, f"expected an integer, got {_shown(value)}")
            if low is not None and value < low:
                self.fail(path, f"must be >= {low}, got {value}")
            if high is not None and value > high:
                self.fail(path, f"{value} is out of range (at most {high:,}); {FIX}")
        elif not isinstance(value, kind):
            self.fail(path, f"expected {_KIND_NAMES.get(kind, kind.__name__)}, got "
                            f"{_json_type(value)} {_shown(value)}")
        return value

    def enum(self, obj: dict, key: str, enum_type, where: str):
        value = self.get(obj, key, str, where)
        try:
            return enum_type(value)
        except ValueError:
            allowed = ", ".join(e.value for e in enum_type)
            self.fail(f"{where}.{key}" if where else key,
                      f"{_shown(value)} is not one of {allowed}: use one of them")

    def agrees(self, obj: dict, key: str, where: str, expected, why: str) -> None:
        """An optional key the file states twice must equal what follows from the rest."""
        if key not in obj:
            return
        value = obj[key]
        if value != expected or type(value) is not type(expected):
            self.fail(f"{where}.{key}" if where else key,
                      f"{_shown(value)} but {why} gives {_shown(expected)}; the file was "
                      f"edited inconsistently: delete the key or {FIX}")


_KIND_NAMES = {str: "a string", bool: "true or false", dict: "a JSON object", list: "a list"}


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", type(None): "null"}.get(type(value), "?")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _groups(groups) -> list[list[int]]:
    return [list(g) for g in groups]


def plan_from_dict(data: object, source: str = "<plan>") -> PlanDocument:
    """Validate a plan JSON object and build the PlanDocument; errors name the key."""
    r = _Reader(source)
    if not isinstance(data, dict):
        r.fail("top level", f"expected a JSON object, got {_json_type(data)}; {FIX}")
    schema = data.get("schema")
    if schema != PLAN_SCHEMA:
        r.fail("schema", f"unknown schema version {_shown(schema)}; this planner reads "
                         f"{PLAN_SCHEMA!r} (re-plan with this version)")
    r.object(data, "top level", TOP_KEYS)
    model = r.object(r.get(data, "model", dict, ""), "model", MODEL_KEYS)
    name = r.get(model, "name", str, "model")
    fingerprint = r.get(model, "fingerprint", str, "model")
    stages_raw = r.get(data, "stages", list, "")
    layers_raw = r.get(data, "layers", list, "")
    if not stages_raw or not layers_raw:
        r.fail("stages" if not stages_raw else "layers", f"must not be empty; {FIX}")
    num_layers = r.get(model, "num_layers", int, "model", 1)
    if num_layers != len(layers_raw):
        r.fail("layers", f"{len(layers_raw)} entries but model.num_layers is {num_layers}; "
                         f"{FIX}")
    stages = []
    for i, st in enumerate(stages_raw):
        where = f"stages[{i}]"
        r.object(st, where, STAGE_KEYS)
        first = r.get(st, "first_layer", int, where, 0, num_layers - 1)
        last = r.get(st, "last_layer", int, where, 0, num_layers - 1)
        devices = r.get(st, "devices", int, where, 1, MAX_DEVICES)
        try:
            stages.append(Stage(first, last, devices))
        except ValueError as exc:
            r.fail(where, f"{exc}; {FIX}")
    strategies, names, digests, params = [], [], [], []
    for i, layer in enumerate(layers_raw):
        where = f"layers[{i}]"
        r.object(layer, where, LAYER_KEYS)
        names.append(r.get(layer, "name", str, where))
        if "digest" in layer:
            digests.append(r.get(layer, "digest", str, where))
            params.append(r.get(layer, "params", int, where, 0))
        try:
            strategies.append(LayerStrategy(
                tp=r.get(layer, "tp", int, where, 1, MAX_DEVICES),
                dp=r.get(layer, "dp", int, where, 1, MAX_DEVICES),
                dp_mode=r.enum(layer, "dp_mode", DPMode, where),
                sequence_parallel=r.get(layer, "sequence_parallel", bool, where),
                checkpoint=r.enum(layer, "checkpoint", Checkpoint, where),
                offload=r.get(layer, "offload", bool, where) if "offload" in layer else False))
        except ValueError as exc:
            r.fail(where, f"{exc}; {FIX}")
    try:
        plan = ParallelPlan(
            stages=tuple(stages), layer_strategies=tuple(strategies),
            global_batch=r.get(data, "global_batch", int, "", 1, MAX_GLOBAL_BATCH),
            micro_batch=r.get(data, "micro_batch", int, "", 1, MAX_GLOBAL_BATCH),
            num_microbatches=r.get(data, "num_microbatches", int, "", 1, MAX_GLOBAL_BATCH),
            schedule=r.enum(data, "schedule", Schedule, ""),
            precision=r.enum(data, "precision", Precision, ""),
            optimizer=r.get(data, "optimizer", str, ""),
            virtual_stages=r.get(data, "virtual_stages", int, "", 1, len(stages)))
    except PlannerError as exc:
        if str(exc).startswith(f"{source}: "):
            raise
        r.fail("plan", f"{exc}; {FIX}")
    world = r.get(data, "world_size", int, "", 1, MAX_DEVICES)
    if world != plan.world_size:
        r.fail("world_size", f"{world} but the stages use {plan.world_size} devices")
    _check_derived(r, data, plan, tuple(names))
    cluster = r.get(data, "cluster", dict, "")
    predicted = data.get("predicted", {})
    search = data.get("search", {})
    for key, value in (("predicted", predicted), ("search", search)):
        if not isinstance(value, dict):
            r.fail(key, f"expected a JSON object, got {_json_type(value)}; {FIX}")
    graph_micro_batch = r.get(model, "graph_micro_batch", int, "model", 1, MAX_GLOBAL_BATCH)
    graph_dtype = r.get(model, "graph_dtype", str, "model")
    seq_len = model.get("seq_len")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int)
                                or not 1 <= seq_len <= 2**31):
        r.fail("model.seq_len", f"expected a positive integer or null, got {_shown(seq_len)}")
    if digests and len(digests) != len(names):
        r.fail("layers", f"{len(digests)} of {len(names)} layers have a digest: all or none")
    spec = model.get("spec")
    if spec is not None and not isinstance(spec, str):
        r.fail("model.spec", f"expected a MODEL string or null, got {_shown(spec)}")
    return PlanDocument(plan, name, fingerprint, tuple(names), cluster, predicted, search,
                        graph_micro_batch, graph_dtype, seq_len, spec, tuple(digests),
                        tuple(params))


def _check_derived(r: _Reader, data: dict, plan: ParallelPlan, names: tuple[str, ...]) -> None:
    """What the file repeats must match what the stages and strategies imply."""
    for i, st in enumerate(data["stages"]):
        where, stage = f"stages[{i}]", plan.stages[i]
        r.agrees(st, "stage", where, i, "its position in the list")
        r.agrees(st, "first_layer_name", where, names[stage.first_layer],
                 f"layers[{stage.first_layer}].name")
        r.agrees(st, "last_layer_name", where, names[stage.last_layer],
                 f"layers[{stage.last_layer}].name")
        r.agrees(st, "ranks", where, list(plan.stage_ranks(i)),
                 "the stage's pipeline rank and device count")
    r.agrees(data, "pipeline_groups", "", _groups(pipeline_groups(plan)),
             "the stages' device counts")
    for i, layer in enumerate(data["layers"]):
        where = f"layers[{i}]"
        r.agrees(layer, "index", where, i, "its position in the list")
        r.agrees(layer, "stage", where, plan.stage_of(i), "the stages' layer ranges")
        if "tp_groups" in layer or "dp_groups" in layer:
            groups = layer_groups(plan, i)
            r.agrees(layer, "tp_groups", where, _groups(groups.tp_groups),
                     "its tp on its stage's ranks (TP innermost)")
            r.agrees(layer, "dp_groups", where, _groups(groups.dp_groups),
                     "its tp on its stage's ranks (TP innermost)")


def load_plan(path: str | os.PathLike) -> PlanDocument:
    """Read and validate a plan file (JSON only: plans are data, never code)."""
    source = os.fspath(path)
    data = read_json(source, "plan file",
                     "re-create it with `planner plan`" if os.path.exists(source)
                     else "write one with `planner plan MODEL --out FILE`")
    return plan_from_dict(data, source)
