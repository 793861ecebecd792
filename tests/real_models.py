"""The real-model acceptance matrix of issue 14: Hugging Face architectures x modes x ranks.

    outcomes = real_models_groups.run_matrix(cases(archs=ARCHS, modes=MODES, worlds=(2, 4)))
    print(format_table(outcomes))

Each case builds one architecture from tests/data/hf/<arch>/config.json (tiny, random
init, fp32, dropout 0), plans it on `world` gloo ranks with the mode's SearchOptions
(the search `planner.auto_parallel` runs on the measured `local` cluster, made ahead once
per case with the architecture's one trace, `real_models_prep`; `plan_case`), runs that
plan through `auto_parallel`, so a plan the executor rejects is on record (`Outcome.plan`,
`Outcome.plan_json`; a Case with `plan_json` replays it), trains STEPS AdamW steps on
fixed global batches and compares the losses and final parameters with single-process
training of the same model from the same seed. Every case gets one outcome:

    PASS         equal to the reference within RTOL (losses) and RTOL/ATOL (parameters)
    REJECTED     auto_parallel raised PlannerError on every rank before the first step
    MISMATCH     trained, but differs from the reference (the largest relative error)
    CRASH        any other exception, before or during training (type, first line)
    HANG         no result within the case limit, or only collective time-outs

The groups that run the cases, their processes and time limits: `real_models_groups`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import traceback
from dataclasses import dataclass

import torch

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "gpt_neox",
         "falcon", "opt", "bert", "roberta", "t5", "bart", "vit", "whisper", "mixtral",
         "qwen2_moe", "deepseek_v3",
         # alternating sliding/full attention whose masks share glue, and an attention
         # owning a per-head parameter (sinks): both broke every mode before (ir.layers, ir.tp)
         "gpt_oss")
# Mode -> SearchOptions pins (precision fp32 is added to all: the ranks are CPU processes).
MODES = {"auto": {}, "tp2": {"tp": 2}, "pp2": {"pp": 2}, "tp2xpp2": {"tp": 2, "pp": 2}}
# World sizes each mode runs on: tp2 x pp2 needs all four ranks.
MODE_WORLDS = {"auto": (2, 4), "tp2": (2, 4), "pp2": (2, 4), "tp2xpp2": (4,)}
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")


def known_archs() -> tuple[str, ...]:
    """Every architecture with a tiny config in CONFIG_DIR: ARCHS (the matrix) and those
    tried outside it (bench_real_models.py --arch gpt_oss,bloom runs any of them)."""
    return tuple(sorted(a for a in os.listdir(CONFIG_DIR)
                        if os.path.isfile(os.path.join(CONFIG_DIR, a, "config.json"))))


GLOBAL_BATCH = 8  # divisible by every dp degree of 4 ranks, 2+ micro-batches for pp2
EXAMPLE_ROWS = 2  # the micro-batch shape auto_parallel measures the layer IR at
SEQ_LEN = 16  # below every config's position limit; small keeps 147 cases quick
STEPS = 3
SEED = 1234
BATCH_SEED = 1000  # global batch k is drawn from seed BATCH_SEED + k
LR = 1e-2  # large enough that three steps move every parameter visibly
# Tolerances as in tests/test_exec_plans.py, which explains them: AdamW eps=1e-4 bounds
# how much summation-order noise in tiny gradients can move a parameter.
EPS = 1e-4
RTOL = 1e-5
ATOL = 5e-6
# One element may move further: AdamW moves it by up to lr / eps per unit of gradient
# noise, and a gradient element summed from large cancelling terms (T5: unscaled
# attention, a tied head) carries ~2e-7 of reassociation noise under TP:
# lr / eps * 2e-7 = 2e-5. The whole tensor must still be within RTOL in norm.
ELEMENT_ATOL = LR / EPS * 2e-7
OPTIMIZER_KWARGS = {"lr": LR, "weight_decay": 0.1, "eps": EPS}  # 0.1: a typical LM decay

# Substrings of the errors a rank sees when a PEER failed (it waited in a collective that
# the peer never joined, or the peer closed its connections): secondary, not the cause.
PEER_FAULT_MARKERS = ("timed out", "timeout", "connection closed", "connection reset",
                      "connection refused", "broken pipe")


STATUSES = PASS, REJECTED, MISMATCH, CRASH, HANG = ("PASS", "REJECTED", "MISMATCH", "CRASH",
                                                    "HANG")
BEFORE_TRAINING = ("not started", "load", "plan")  # stages before the first optimizer step


@dataclass(frozen=True)
class Case:
    arch: str
    mode: str
    world: int
    # plan JSON (a recorded run's "plan_json") to run instead of searching: replays a
    # flaky case with the plan it drew (bench_real_models.py --only KEY --plan FILE)
    plan_json: str = ""

    @property
    def key(self) -> str:
        return f"{self.arch}/{self.mode}/{self.world}r"

    @classmethod
    def parse(cls, key: str, plan_json: str = "") -> "Case":
        """`arch/mode/Nr` (a `key`) -> its Case; ValueError naming what is wrong."""
        parts = key.split("/")
        if len(parts) != 3 or parts[0] not in known_archs() or parts[1] not in MODES \
                or not re.fullmatch(r"[0-9]+r", parts[2]):
            raise ValueError(f"{key!r} is not arch/mode/Nr with arch in tests/data/hf and mode in "
                             f"{', '.join(MODES)} (e.g. falcon/auto/4r)")
        return cls(parts[0], parts[1], int(parts[2][:-1]), plan_json)


@dataclass(frozen=True)
class Outcome:
    case: Case
    status: str
    reason: str = ""
    seconds: float = 0.0
    plan: str = ""  # compact: the plan's summary and each run of layers' strategy
    trace: str = ""  # the failing rank's last frames, for whoever fixes it
    plan_json: str = ""  # the whole plan document (cluster spec included): replays the case

    def to_dict(self) -> dict:
        return {"arch": self.case.arch, "mode": self.case.mode, "ranks": self.case.world,
                "key": self.case.key, "outcome": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 2), "plan": self.plan, "trace": self.trace,
                "plan_json": self.plan_json}


def cases(archs=ARCHS, modes=tuple(MODES), worlds=(2, 4)) -> list[Case]:
    return [Case(a, m, w) for w in worlds for a in archs for m in modes if w in MODE_WORLDS[m]]


# ----------------------------------------------------------------------------- models


def build(arch: str, rows: int = EXAMPLE_ROWS, seed: int = SEED):
    """(module with dropout 0, inputs, target, loss_fn) built from `seed` on the CPU."""
    from dist_utils import zero_dropout
    from planner.models import load_model

    loaded = load_model(f"hf:{os.path.join(CONFIG_DIR, arch, 'config.json')}",
                        micro_batch=rows, seq_len=SEQ_LEN, device="cpu", seed=seed)
    return zero_dropout(loaded.module, loaded.config), loaded.inputs, loaded.target, loaded.loss_fn


def global_batches(arch: str) -> list:
    """[(inputs, target)] of each step: `build`'s values, drawn without building a model
    (`planner.models.example_batch`; three CPU builds per architecture before)."""
    from planner.models import example_batch

    spec = f"hf:{os.path.join(CONFIG_DIR, arch, 'config.json')}"
    return [example_batch(spec, GLOBAL_BATCH, SEQ_LEN, BATCH_SEED + k) for k in range(STEPS)]


def reference(arch: str) -> dict:
    """Single-process training on the global batches: losses and final parameters. Two
    forwards must agree first (a random op left in training mode would make every
    comparison meaningless)."""
    from dist_utils import train_one_device
    from ir.trace import model_output_tensor

    batches = global_batches(arch)
    model, _, _, loss_fn = build(arch)
    with torch.no_grad():
        first, second = (model_output_tensor(model(**batches[0][0])) for _ in range(2))
    if not torch.equal(first, second):
        raise AssertionError(f"{arch}: two forwards differ in training mode (dropout left?)")
    losses, _ = train_one_device(model, loss_fn, batches, dict(OPTIMIZER_KWARGS))
    # Every name of a shared parameter (tied embeddings): each copy the executor keeps
    # must end where the shared one did.
    state, aliases = {}, {}
    for name, param in model.named_parameters(remove_duplicate=False):
        state[name] = param.detach().clone()
        aliases.setdefault(id(param), []).append(name)
    return {"batches": batches, "losses": losses, "state": state,
            "aliases": list(aliases.values())}


# ----------------------------------------------------------------------------- one rank


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _full(exc: BaseException) -> str:
    """The whole reason, for the record (the table shows REASON_WIDTH characters)."""
    return f"{type(exc).__name__}: {str(exc).strip()}"


def compare(losses: list[float], state: dict, ref: dict) -> dict:
    """Relative loss error per step and the worst parameter (by relative error norm)."""
    loss_rel = [abs(g - r) / max(abs(r), 1e-12) for g, r in zip(losses, ref["losses"])]
    worst = {"name": "", "rel": 0.0, "abs": 0.0, "ok": True}
    missing = [names[0] for names in ref["aliases"] if not any(n in state for n in names)]
    for name in [n for n in ref["state"] if n in state]:
        got, expected = state[name], ref["state"][name]
        norm = float(expected.double().norm())
        if got.shape != expected.shape:  # a shard where the whole tensor belongs
            error_norm = biggest = float("inf")
        else:
            error = got.double() - expected.double()
            error_norm, biggest = float(error.norm()), float(error.abs().max())
        ok = error_norm <= RTOL * norm + ATOL and biggest <= ELEMENT_ATOL
        rel = error_norm / max(norm, 1e-12)
        if (not ok, rel) > (not worst["ok"], worst["rel"]):
            worst = {"name": name, "rel": rel, "abs": biggest, "ok": ok}
    return {"loss_rel": loss_rel, "missing": missing, "param": worst}


def compact_plan(plan) -> str:
    """The plan's summary, then each run of consecutive layers with one strategy:
    `plan(pp=1, ...) | L0-2 tp2·dp2 | L3-4 tp1·dp4·z1` (stages are in the summary)."""
    runs, start = [], 0
    strategies = plan.layer_strategies
    for j in range(1, len(strategies) + 1):
        if j == len(strategies) or strategies[j] != strategies[start]:
            span = f"L{start}" if j - 1 == start else f"L{start}-{j - 1}"
            runs.append(f"{span} {strategies[start]}")
            start = j
    return " | ".join([str(plan)] + runs)


@functools.lru_cache(maxsize=None)
def traced_graph(arch: str):
    """The layer graph `build(arch)` traces to, as `run_case` and `auto_parallel` trace
    it; once per process and arch (the replays' plans each read falcon's)."""
    from ir.measure import build_layer_graph

    model, inputs, target, loss_fn = build(arch)
    return build_layer_graph(model, inputs, target, loss_fn, name=type(model).__name__,
                             dtype=torch.float32)


def layer_plan_json(arch: str, world: int, tps: tuple[int, ...]) -> str:
    """Plan JSON for `arch` on `world` ranks in one stage: layer j at TP degree tps[j],
    data parallel over the rest (plain replication), one micro-batch per step."""
    from cost_models.clusters import get_cluster
    from ir.plan import ParallelPlan, PlanDocument, model_identity, plan_to_json
    from ir.strategy import LayerStrategy, Precision, Stage

    graph = traced_graph(arch)
    strategies = tuple(LayerStrategy(tp=t, dp=world // t) for t in tps)
    plan = ParallelPlan(stages=(Stage(0, len(tps) - 1, world),), layer_strategies=strategies,
                        global_batch=GLOBAL_BATCH,
                        micro_batch=GLOBAL_BATCH // max(s.dp for s in strategies),
                        num_microbatches=1, precision=Precision.FP32)
    spec = get_cluster("local", nodes=1, gpus_per_node=world)
    return plan_to_json(PlanDocument(plan, graph.model, cluster=spec.to_dict(),
                                     **model_identity(graph)))


def plan_case(case: Case, graph, world: int, searched: str | None = None) -> str:
    """The plan JSON every rank runs for `case`: the case's own (a replay), else the one
    `searched` ahead (`real_models_prep`), else rank 0 runs `search_plan` and broadcasts
    it. Planned here rather than inside `auto_parallel` so that a plan the executor
    rejects is still on record. PlannerError (on every rank) when the search finds none."""
    import torch.distributed as dist

    from ir.errors import PlannerError
    from real_models_prep import search_plan

    if case.plan_json:
        return case.plan_json
    text = [searched]
    if searched is None:
        text = [search_plan(case, graph, world) if dist.get_rank() == 0 else ""]
        dist.broadcast_object_list(text, src=0)  # a str: the plan is data either way
    if text[0].startswith("error: "):
        raise PlannerError(f"auto_parallel could not plan {graph.model}: "
                           f"{text[0][len('error: '):]}")
    return text[0]


@contextlib.contextmanager
def _graph_served(graph, *args, **kwargs):
    """`auto_parallel`'s `build_layer_graph` call returns `graph` when its arguments are
    the very ones `graph` was built for (`run_case`): no trace of its own. A call with any
    other argument is traced as usual."""
    import planner.api as api

    real = api.build_layer_graph

    def same(a, b) -> bool:  # the same objects, in a container auto_parallel rebuilt
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
            return len(a) == len(b) and all(map(same, a, b))
        return a is b or (isinstance(a, (str, torch.dtype)) and a == b)

    def served(*call_args, **call_kwargs):
        if (len(call_args) == len(args) and all(map(same, call_args, args))
                and call_kwargs.keys() == kwargs.keys()
                and all(same(call_kwargs[k], kwargs[k]) for k in kwargs)):
            return graph
        return real(*call_args, **call_kwargs)

    api.build_layer_graph = served
    try:
        yield
    finally:
        api.build_layer_graph = real


def run_case(case: Case, ref: dict, rank: int, log) -> dict:
    """On one rank: plan, shard, train and (rank 0) compare. Never raises. The plan is
    in the result from the moment it exists, so a rejected or crashed case has it."""
    import torch.distributed as dist

    from executors import full_state_dict
    from ir.errors import PlannerError
    from ir.measure import build_layer_graph
    from ir.plan import plan_from_dict
    from ir.strategy import Precision
    from planner.api import auto_parallel

    stage = "load"
    recorded: dict = {}
    try:
        model, inputs, target, loss_fn = build(case.arch)
        stage = "plan"
        log("stage", stage=stage)
        try:
            # The graph and plan made ahead, once per architecture and case, before the
            # groups start (`real_models_prep`); where that failed every rank traces and
            # rank 0 searches, as before. auto_parallel's own call, the same arguments,
            # is served this graph (`_graph_served`).
            traced_as = dict(name=type(model).__name__, dtype=torch.float32)
            graph = ref.get("graph")
            if graph is None:
                graph = build_layer_graph(model, inputs, target, loss_fn, **traced_as)
            text = plan_case(case, graph, dist.get_world_size(),
                             ref.get("plans", {}).get(case.key))
            doc = plan_from_dict(json.loads(text), f"<plan of {case.key}>")
            recorded = {"plan": compact_plan(doc.plan), "plan_json": text}
            with _graph_served(graph, model, inputs, target, loss_fn, **traced_as):
                pm = auto_parallel(model, (inputs, target), loss_fn=loss_fn,
                                   optimizer=torch.optim.AdamW,
                                   optimizer_kwargs=dict(OPTIMIZER_KWARGS), cluster="local",
                                   global_batch=GLOBAL_BATCH, precision=Precision.FP32,
                                   plan=doc)
        except PlannerError as exc:
            return {"state": "rejected", "stage": stage, "error": _full(exc), **recorded}
        losses = []
        for step, batch in enumerate(ref["batches"]):
            stage = "train"
            log("stage", stage=f"train step {step + 1}")
            losses.append(pm.train_step(batch))
        stage = "gather"
        state = full_state_dict(pm.parallel)
        result = {"state": "ok", "stage": stage, "losses": losses, **recorded}
        if rank == 0:
            result["compare"] = compare(losses, state, ref)
        return result
    except Exception as exc:  # every failure is an outcome; the matrix goes on
        return {"state": "crash", "stage": stage, "error": _full(exc),
                "trace": traceback.format_exc(limit=-3), **recorded}


# ----------------------------------------------------------------------------- outcomes


def _peer_fault(error: str) -> bool:
    return any(marker in error.lower() for marker in PEER_FAULT_MARKERS)


def classify(case: Case, results: list[dict], seconds: float = 0.0) -> Outcome:
    """One outcome from every rank's result of a case."""
    plan = next((r["plan"] for r in results if r.get("plan")), "")
    plan_json = next((r["plan_json"] for r in results if r.get("plan_json")), "")

    def outcome(status: str, reason: str = "", trace: str = "") -> Outcome:
        return Outcome(case, status, reason, seconds, plan, trace, plan_json)

    failed = [(rank, r) for rank, r in enumerate(results) if r["state"] != "ok"]
    if failed:
        if all(r["state"] == "rejected" for r in results):
            return outcome(REJECTED, results[0]["error"])
        causes = [(rank, r) for rank, r in failed if not _peer_fault(r["error"])]
        rank, r = (causes or failed)[0]
        when = "before training" if r["stage"] in BEFORE_TRAINING else "during training"
        if not causes:
            return outcome(HANG, f"collectives timed out at {r['stage']} ({when}): {r['error']}")
        if r["state"] == "rejected":
            ranks = [k for k, f in failed if f["state"] == "rejected"]
            return outcome(CRASH, f"rejected on ranks {ranks} only ({when}): {r['error']}")
        return outcome(CRASH, f"{when}, {r['stage']}, rank {rank}: {r['error']}",
                       r.get("trace", ""))
    cmp = results[0]["compare"]
    off = [(step, rel) for step, rel in enumerate(cmp["loss_rel"]) if not rel <= RTOL]  # NaN too
    if off:
        step, worst = max(off, key=lambda s: s[1] if s[1] == s[1] else float("inf"))
        return outcome(MISMATCH, f"loss rel diff {worst:.1e} at step {step + 1}")
    if cmp["missing"]:
        return outcome(MISMATCH, f"{len(cmp['missing'])} parameters missing, e.g. "
                                 f"{cmp['missing'][0]}")
    param = cmp["param"]
    if not param["ok"]:
        return outcome(MISMATCH, f"param {param['name']}: rel diff {param['rel']:.1e}, "
                                 f"max abs {param['abs']:.1e}")
    return outcome(PASS)


# ----------------------------------------------------------------------------- targets


PASS_RATE_TARGET = 0.9  # issue 14: at least 90% of runs pass
PASS_RATE = f"{100 * PASS_RATE_TARGET:.0f}% of runs pass"
AUTO_TARGET = "every architecture passes auto"
REASON_WIDTH = 160  # characters of a reason the table shows (the JSON keeps it whole)


def target_failures(outcomes: list[Outcome]) -> dict[str, list[Outcome]]:
    """Issue 14's targets, each with the outcomes that miss it (empty: met)."""
    passed = sum(o.status == PASS for o in outcomes)
    rate_met = passed >= PASS_RATE_TARGET * len(outcomes)
    return {
        "no silent mismatch": [o for o in outcomes if o.status == MISMATCH],
        "no crash": [o for o in outcomes if o.status == CRASH],
        "no hang": [o for o in outcomes if o.status == HANG],
        PASS_RATE: [] if rate_met else [o for o in outcomes if o.status != PASS],
        AUTO_TARGET: [o for o in outcomes if o.case.mode == "auto" and o.status != PASS],
    }


def missed_targets(outcomes: list[Outcome]) -> list[str]:
    """One line per missed target (empty: all met)."""
    passed, lines = sum(o.status == PASS for o in outcomes), []
    for target, bad in target_failures(outcomes).items():
        archs = list(dict.fromkeys(o.case.arch for o in bad))
        what = {PASS_RATE: f"{passed}/{len(outcomes)} pass ({100 * passed / len(outcomes):.0f}%)",
                AUTO_TARGET: f"{len(archs)} architectures fail it: {', '.join(archs)}"}.get(
            target, f"{len(bad)} runs: {', '.join(o.case.key for o in bad)}")
        lines += [f"{target}: {what}"] if bad else []
    return lines


def format_grid(outcomes: list[Outcome]) -> str:
    """arch x (mode, ranks): each cell an outcome; then the counts."""
    columns = list(dict.fromkeys((o.case.mode, o.case.world) for o in outcomes))
    cell = {(o.case.arch, o.case.mode, o.case.world): o.status for o in outcomes}
    archs = list(dict.fromkeys(o.case.arch for o in outcomes))
    width = max(len(a) for a in archs + ["arch"])
    lines = [f"{'arch':<{width}}  " + "  ".join(f"{f'{m}@{w}r':<10}" for m, w in columns)]
    for arch in archs:
        lines.append(f"{arch:<{width}}  " + "  ".join(
            f"{cell.get((arch, m, w), '-'):<10}" for m, w in columns))
    counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(outcomes)} runs")
    return "\n".join(lines)


def format_cases(outcomes: list[Outcome]) -> str:
    """One line per case: outcome, seconds, and the reason (or the plan that ran)."""
    lines = [f"{'case':<24} {'outcome':<9} {'s':>5}  reason / plan"]
    for o in outcomes:
        lines.append(f"{o.case.key:<24} {o.status:<9} {o.seconds:>5.1f}  "
                     f"{(o.reason or o.plan)[:REASON_WIDTH]}")
    return "\n".join(lines)


def format_table(outcomes: list[Outcome]) -> str:
    return format_grid(outcomes) + "\n\n" + format_cases(outcomes)
