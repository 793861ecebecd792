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

from ir.embedding_tables import (SPARSE_OPTIMIZERS, EmbeddingPlan, EmbeddingTable, PlacedTable,
                                 Shard, TableDtype, TablePlacement, TableSharding,
                                 table_shards)
from ir.errors import PlannerError
from ir.plan import (OPTIMIZER_IMPLEMENTATIONS, PLAN_SCHEMA, ParallelPlan, PlanDocument,
                     layer_groups, pipeline_groups)
from ir.safe_json import read_json
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision, Schedule, Stage

FIX = "re-create it with `planner plan`"
# Sanity bounds: more devices or samples than any cluster runs is an edited file.
MAX_DEVICES = 2**20
MAX_GLOBAL_BATCH = 2**40

TOP_KEYS = ("schema", "model", "cluster", "world_size", "global_batch", "micro_batch",
            "num_microbatches", "schedule", "precision", "optimizer", "optimizer_impl",
            "clip_grad_norm", "virtual_stages",
            "stages", "pipeline_groups", "layers", "predicted", "search", "embedding_tables")
MODEL_KEYS = ("name", "spec", "fingerprint", "num_layers", "graph_micro_batch", "graph_dtype",
              "seq_len")
STAGE_KEYS = ("stage", "first_layer", "last_layer", "first_layer_name", "last_layer_name",
              "devices", "ranks")
EMBEDDING_KEYS = ("sparse_optimizer", "node_size", "tables")
TABLE_KEYS = ("table", "rows", "dim", "dtype", "dtype_bytes", "pooling", "ids_per_sample",
              "hot_row_fraction", "sharding", "ranks", "shards")
SHARD_KEYS = ("rank", "rows", "columns")
MAX_TABLE_ROWS = 2**40  # sanity bound: no table has more rows (ids are int64 anyway)
MAX_TABLE_DIM = 2**20
DTYPE_BYTES = (1, 2, 4, 8)  # int8/fp8, 16-bit, fp32, fp64 table elements
POOLINGS = ("sum", "mean", "max")  # nn.EmbeddingBag's modes
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
    world_size = r.get(data, "world_size", int, "", 1, MAX_DEVICES)
    embeddings = _embeddings(r, data, world_size, tuple(names),
                             r.get(model, "graph_dtype", str, "model"))
    try:
        plan = ParallelPlan(
            stages=tuple(stages), layer_strategies=tuple(strategies), embeddings=embeddings,
            global_batch=r.get(data, "global_batch", int, "", 1, MAX_GLOBAL_BATCH),
            micro_batch=r.get(data, "micro_batch", int, "", 1, MAX_GLOBAL_BATCH),
            num_microbatches=r.get(data, "num_microbatches", int, "", 1, MAX_GLOBAL_BATCH),
            schedule=r.enum(data, "schedule", Schedule, ""),
            precision=r.enum(data, "precision", Precision, ""),
            optimizer=r.get(data, "optimizer", str, ""),
            optimizer_impl=_optimizer_impl(r, data),
            clip_grad_norm=r.get(data, "clip_grad_norm", bool, "") if "clip_grad_norm" in data
            else False,
            virtual_stages=r.get(data, "virtual_stages", int, "", 1, len(stages)))
    except PlannerError as exc:
        if str(exc).startswith(f"{source}: "):
            raise
        r.fail("plan", f"{exc}; {FIX}")
    world = world_size
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


def _optimizer_impl(r: _Reader, data: dict) -> str | None:
    """How the executor steps the optimizer; absent (a plan written before it was
    recorded): None, the default rule for the device it runs on."""
    if "optimizer_impl" not in data:
        return None
    value = r.get(data, "optimizer_impl", str, "")
    if value not in OPTIMIZER_IMPLEMENTATIONS:
        r.fail("optimizer_impl", f"{_shown(value)} is not one of "
                                 f"{', '.join(OPTIMIZER_IMPLEMENTATIONS)}: use one of them "
                                 "(or delete the key for the device's default)")
    return value


def _in_model(table: str, layer_names: tuple[str, ...]) -> bool:
    """A table is one of the plan's layers or a module inside one."""
    return any(table == n or (n and table.startswith(n + ".")) or not n for n in layer_names)


def _embeddings(r: _Reader, data: dict, world: int, layer_names: tuple[str, ...],
                graph_dtype: str) -> EmbeddingPlan | None:
    """The "embedding_tables" section: every table known to the model's layers, its ranks
    inside the world, its shards (when listed) tiling the table as the executor splits it.
    A table without "dtype" (plans written before it was recorded) has the model's traced
    dtype, `graph_dtype`, when its "dtype_bytes" agree."""
    if "embedding_tables" not in data:
        return None
    where = "embedding_tables"
    emb = r.object(r.get(data, where, dict, ""), where, EMBEDDING_KEYS)
    optimizer = r.get(emb, "sparse_optimizer", str, where)
    if optimizer not in SPARSE_OPTIMIZERS:
        r.fail(f"{where}.sparse_optimizer", f"{_shown(optimizer)} is not one of "
                                            f"{', '.join(SPARSE_OPTIMIZERS)}: use one of them")
    node_size = r.get(emb, "node_size", int, where, 1, MAX_DEVICES)
    raw = r.get(emb, "tables", list, where)
    if not raw:
        r.fail(f"{where}.tables", f"must not be empty (drop {where} for a plan without "
                                  "sharded tables)")
    placed, seen = [], {}
    for i, t in enumerate(raw):
        w = f"{where}.tables[{i}]"
        r.object(t, w, TABLE_KEYS)
        name = r.get(t, "table", str, w)
        if not _in_model(name, layer_names):
            r.fail(f"{w}.table", f"unknown table {_shown(name)}: the model's layers are "
                                 f"{', '.join(layer_names[:4])}...; name one of its tables")
        if name in seen:
            r.fail(f"{w}.table", f"{name} is placed twice (also tables[{seen[name]}]); "
                                 "place it once")
        seen[name] = i
        pooling = t.get("pooling")
        if pooling is not None and pooling not in POOLINGS:
            r.fail(f"{w}.pooling", f"{_shown(pooling)} is not null or one of "
                                   f"{', '.join(POOLINGS)}")
        hot = t.get("hot_row_fraction")
        if hot is not None and (isinstance(hot, bool) or not isinstance(hot, (int, float))
                                or not 0 <= hot <= 1):
            r.fail(f"{w}.hot_row_fraction", f"expected null or a number in [0, 1], got "
                                            f"{_shown(hot)}")
        dtype_bytes = r.get(t, "dtype_bytes", int, w, 1, 8)
        if dtype_bytes not in DTYPE_BYTES:
            r.fail(f"{w}.dtype_bytes", f"{dtype_bytes} is not one of {DTYPE_BYTES}")
        dtype = _table_dtype(r, t, w, graph_dtype)
        if dtype.element_bytes != dtype_bytes:
            r.fail(f"{w}.dtype_bytes", f"{dtype_bytes} but dtype {dtype} has "
                                       f"{dtype.element_bytes} bytes per element; {FIX}")
        table = EmbeddingTable(name, r.get(t, "rows", int, w, 1, MAX_TABLE_ROWS),
                               r.get(t, "dim", int, w, 1, MAX_TABLE_DIM), dtype, pooling,
                               r.get(t, "ids_per_sample", int, w, 1, MAX_GLOBAL_BATCH),
                               None if hot is None else float(hot))
        sharding = r.enum(t, "sharding", TableSharding, w)
        ranks = r.get(t, "ranks", list, w)
        for j in range(len(ranks)):
            if isinstance(ranks[j], bool) or not isinstance(ranks[j], int) or ranks[j] < 0:
                r.fail(f"{w}.ranks[{j}]", f"expected a rank (an integer >= 0), got "
                                          f"{_shown(ranks[j])}")
            if ranks[j] >= world:
                r.fail(f"{w}.ranks[{j}]", f"rank {ranks[j]} is out of range: the plan has "
                                          f"{world} ranks (0..{world - 1})")
        try:
            placement = TablePlacement(name, sharding, tuple(ranks))
            shards = table_shards(table, placement, world, node_size)
        except PlannerError as exc:
            r.fail(w, f"{exc}; {FIX}")
        if "shards" in t:
            _check_shards(r, r.get(t, "shards", list, w), f"{w}.shards", table, sharding, shards)
        placed.append(PlacedTable(table, placement))
    return EmbeddingPlan(tuple(placed), optimizer, node_size)


def _table_dtype(r: _Reader, t: dict, where: str, graph_dtype: str) -> TableDtype:
    """A table's "dtype"; absent (an older plan): the model's traced dtype."""
    if "dtype" in t:
        return r.enum(t, "dtype", TableDtype, where)
    try:
        return TableDtype(graph_dtype)
    except ValueError:
        r.fail(f"{where}.dtype", f"missing, and the model's traced dtype {_shown(graph_dtype)} "
                                 f"is no table dtype; {FIX}")


def _bounds(r: _Reader, value, where: str, size: int) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        r.fail(where, f"expected [start, stop] integers, got {_shown(value)}")
    start, stop = value
    if not 0 <= start < stop <= size:
        r.fail(where, f"[{start}, {stop}) is not a range inside [0, {size}); {FIX}")
    return start, stop


def _check_tiling(r: _Reader, where: str, what: str, spans: list[tuple[int, int]],
                  size: int) -> None:
    """Shard ranges must neither overlap nor leave a gap in [0, size)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    covered = 0
    for k, i in enumerate(order):
        start, stop = spans[i]
        if start < covered:
            before = order[k - 1]
            r.fail(where, f"shards {before} and {i} both hold {what} [{start}, "
                          f"{min(stop, covered)}): {what} ranges must not overlap; {FIX}")
        if start > covered:
            r.fail(where, f"{what} [{covered}, {start}) are held by no shard: the ranges must "
                          f"cover the table; {FIX}")
        covered = stop
    if covered < size:
        r.fail(where, f"{what} [{covered}, {size}) are held by no shard: the ranges must "
                      f"cover the table; {FIX}")


def _check_shards(r: _Reader, raw: list, where: str, table: EmbeddingTable,
                  sharding: TableSharding, expected: tuple[Shard, ...]) -> None:
    """The file's shard list: well formed, tiling the table, and equal to the executor's."""
    listed = []
    for i, s in enumerate(raw):
        w = f"{where}[{i}]"
        r.object(s, w, SHARD_KEYS)
        rank = r.get(s, "rank", int, w, 0)
        rows = _bounds(r, r.get(s, "rows", list, w), f"{w}.rows", table.rows)
        cols = _bounds(r, r.get(s, "columns", list, w), f"{w}.columns", table.dim)
        listed.append(Shard(rank, *rows, *cols))
    if sharding in (TableSharding.ROW_RANGE, TableSharding.TABLE_ROW_WISE,
                    TableSharding.TABLE_WISE):
        _check_tiling(r, where, "rows", [(s.row_start, s.row_stop) for s in listed], table.rows)
    if sharding in (TableSharding.COLUMN_WISE, TableSharding.TABLE_WISE):
        _check_tiling(r, where, "columns", [(s.col_start, s.col_stop) for s in listed],
                      table.dim)
    if tuple(listed) != expected:
        r.fail(where, f"[{', '.join(map(str, listed))}] but {sharding} over ranks "
                      f"{[s.rank for s in expected]} holds [{', '.join(map(str, expected))}] "
                      f"(even splits, in rank order); delete the key or {FIX}")


def load_plan(path: str | os.PathLike) -> PlanDocument:
    """Read and validate a plan file (JSON only: plans are data, never code)."""
    source = os.fspath(path)
    data = read_json(source, "plan file",
                     "re-create it with `planner plan`" if os.path.exists(source)
                     else "write one with `planner plan MODEL --out FILE`")
    return plan_from_dict(data, source)
