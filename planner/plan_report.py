"""Plans for people and files: the plan document of a search result, and its tables."""

from __future__ import annotations

import math

from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.legality import sequence_parallel_applies
from ir.plan import PlanDocument, model_identity, record_implementation
from planner.fmt import human_bytes, table
from planner.search_stats import SearchStats


def plan_document(graph, cluster, candidate, stats: SearchStats,
                  extra: dict | None = None, model_spec: str | None = None) -> PlanDocument:
    """The plan file's content for a searched candidate (see ir/plan.py); `model_spec` is
    the MODEL argument that rebuilds the model (None for a Python model)."""
    return PlanDocument(
        plan=record_implementation(candidate.plan, cluster.device), model_name=graph.model, cluster=cluster.to_dict(),
        predicted=candidate.estimate.to_json(), search={**stats.to_json(), **(extra or {})},
        model_spec=model_spec, **model_identity(graph))


# Marks a TP degree on a layer with nothing to shard (a norm, a position embedding): its
# TP group computes it replicated, matching its neighbours' layout.
REPLICATED_MARK = "*"


def strategy_rows(doc: PlanDocument, graph: LayerGraph | None = None) -> list[list[object]]:
    """Consecutive layers of one stage with one strategy share a row. With the layer IR,
    the tp and sp columns say what really runs sharded."""
    plan, names = doc.plan, doc.layer_names

    def cells(j: int) -> tuple[str, str]:
        s = plan.layer_strategies[j]
        if graph is None:
            return str(s.tp), "yes" if s.sequence_parallel else "-"
        layer = graph.layers[j]
        tp = f"{s.tp}{REPLICATED_MARK}" if s.tp > 1 and not layer.tp_candidates else str(s.tp)
        return tp, "yes" if sequence_parallel_applies(layer, s) else "-"

    rows, i = [], 0
    while i < len(names):
        j = i
        while (j + 1 < len(names) and plan.layer_strategies[j + 1] == plan.layer_strategies[i]
               and plan.stage_of(j + 1) == plan.stage_of(i) and cells(j + 1) == cells(i)):
            j += 1
        s = plan.layer_strategies[i]
        span = names[i] if i == j else f"{names[i]} .. {names[j]}"
        tp, sp = cells(i)
        rows.append([f"{i}" if i == j else f"{i}-{j}", span, plan.stage_of(i), tp, s.dp,
                     f"{s.dp_mode.stage}+off" if s.offload else s.dp_mode.stage, sp,
                     s.checkpoint.value])
        i = j + 1
    return rows


def strategy_table(doc: PlanDocument, graph: LayerGraph | None = None) -> str:
    headers = ["layers", "names", "stage", "tp", "dp", "zero", "sp", "checkpoint"]
    rows = strategy_rows(doc, graph)
    text = table(headers, rows, right={2, 3, 4, 5})
    if any(str(r[3]).endswith(REPLICATED_MARK) for r in rows):
        text += (f"\n{REPLICATED_MARK} nothing to shard: the layer runs replicated in its TP "
                 "group (same layout as its neighbours)")
    if any(str(r[5]).endswith("+off") for r in rows):
        text += ("\n+off CPU offload: the layer's model states live in host memory, the "
                 "optimizer steps it on the CPU")
    return text


def summary_line(doc: PlanDocument) -> str:
    p = doc.plan
    stages = ", ".join(f"{doc.layer_names[s.first_layer]}..{doc.layer_names[s.last_layer]}"
                       for s in p.stages)
    v = f" x {p.virtual_stages} chunks" if p.virtual_stages > 1 else ""
    return (f"{doc.model_name}: {p.world_size} devices, pp {p.pp}{v}, {p.schedule}, "
            f"{p.num_microbatches} micro-batches of {p.micro_batch}, global batch "
            f"{p.global_batch}, {p.precision}; stages: {stages}")


PREDICTED_FIGURES = ("iteration_seconds", "samples_per_second", "tflops_per_device", "mfu")
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "overhead")


def check_predicted(predicted: dict, source: str) -> None:
    """Raise unless the figures `predicted_lines` and `stage_memory_table` print are
    numbers: a plan file is data someone may have edited, and `show` formats them."""
    def number(value, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise PlannerError(f"{source}: {where}: expected a number, got {value!r:.60}; "
                               "re-create the plan with `planner plan` (or delete "
                               "\"predicted\")")

    def mapping(value, where: str) -> dict:
        if not isinstance(value, dict):
            raise PlannerError(f"{source}: {where}: expected a JSON object, got "
                               f"{type(value).__name__}; re-create the plan with `planner plan`")
        return value

    if not predicted:
        return
    for key in PREDICTED_FIGURES:
        number(predicted.get(key), f"predicted.{key}")
    memory = mapping(predicted.get("memory", {}), "predicted.memory")
    for key in ("peak_bytes", "device_bytes"):
        if key in memory:
            number(memory[key], f"predicted.memory.{key}")
    stages = memory.get("stages", [])
    if not isinstance(stages, list):
        raise PlannerError(f"{source}: predicted.memory.stages: expected a list; re-create "
                           "the plan with `planner plan`")
    for i, stage in enumerate(stages):
        where = f"predicted.memory.stages[{i}]"
        mapping(stage, where)
        number(stage.get("stage"), f"{where}.stage")
        number(stage.get("peak_bytes"), f"{where}.peak_bytes")
        if "host_bytes" in stage:  # offloaded states; `stage_memory_table` prints them
            number(stage["host_bytes"], f"{where}.host_bytes")
        breakdown = mapping(stage.get("breakdown"), f"{where}.breakdown")
        for part in MEMORY_PARTS:
            number(breakdown.get(part), f"{where}.breakdown.{part}")


def predicted_lines(predicted: dict) -> str:
    if not predicted:
        return "no prediction recorded"
    mem = predicted.get("memory", {})
    return (f"predicted: {predicted['iteration_seconds']:.4g} s per iteration, "
            f"{predicted['samples_per_second']:,.2f} samples/s, "
            f"{predicted['tflops_per_device']:,.1f} TFLOP/s per device, MFU "
            f"{100 * predicted['mfu']:.1f}%; peak {human_bytes(mem.get('peak_bytes', 0))} of "
            f"{human_bytes(mem.get('device_bytes', 0))}")


def stage_memory_table(predicted: dict) -> str:
    rows = []
    for s in predicted.get("memory", {}).get("stages", []):
        b = s["breakdown"]
        rows.append([s["stage"], *(human_bytes(b[k]) for k in MEMORY_PARTS),
                     human_bytes(s["peak_bytes"]),
                     human_bytes(s.get("host_bytes", 0))])  # CPU offload: host memory
    return table(["stage", "params", "grads", "optimizer", "activations", "buffers",
                  "overhead", "peak", "host"], rows, right=set(range(1, 9)))
