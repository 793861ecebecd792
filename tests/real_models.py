"""The real-model acceptance matrix of issue 14: Hugging Face architectures x modes x ranks.

    outcomes = run_matrix(cases(archs=ARCHS, modes=MODES, worlds=(2, 4)))
    print(format_table(outcomes))

Each case builds one architecture from tests/data/hf/<arch>/config.json (tiny, random
init, fp32, dropout 0), calls `planner.auto_parallel` on `world` gloo ranks with the
mode's SearchOptions, trains STEPS AdamW steps on fixed global batches and compares the
losses and final parameters with single-process training of the same model from the
same seed. Every case gets one outcome:

    PASS         equal to the reference within RTOL (losses) and RTOL/ATOL (parameters)
    REJECTED     auto_parallel raised PlannerError on every rank before the first step
    MISMATCH     trained, but differs from the reference (the largest relative error)
    CRASH        any other exception, before or during training (type, first line)
    HANG         no result within CASE_LIMIT_S, or only collective time-outs

Isolation: all cases of one world size run in ONE spawned group of processes (spawning
is the expensive part on 2 cores). Each case gets its own default process group (a
fresh prefix of one long-lived TCPStore), destroyed after the case, so the DeviceMesh
sub-groups that auto_parallel creates never leak into the next case and a collective
left half-done by a failing rank cannot desynchronise it. Ranks agree that a case is
over through the store (not gloo), and each rank logs its progress to a file; the
parent kills a group that died or stalled, marks that case, and restarts a group for
the remaining cases.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch import nn

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "gpt_neox",
         "falcon", "opt", "bert", "roberta", "t5", "bart", "vit", "whisper", "mixtral",
         "qwen2_moe", "deepseek_v3")
# Mode -> SearchOptions pins (precision fp32 is added to all: the ranks are CPU processes).
MODES = {"auto": {}, "tp2": {"tp": 2}, "pp2": {"pp": 2}, "tp2xpp2": {"tp": 2, "pp": 2}}
# World sizes each mode runs on: tp2 x pp2 needs all four ranks.
MODE_WORLDS = {"auto": (2, 4), "tp2": (2, 4), "pp2": (2, 4), "tp2xpp2": (4,)}
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hf")

GLOBAL_BATCH = 8  # divisible by every dp degree of 4 ranks, 2+ micro-batches for pp2
EXAMPLE_ROWS = 2  # the micro-batch shape auto_parallel measures the layer IR at
SEQ_LEN = 16  # below every config's position limit; small keeps 140 cases quick
STEPS = 3
SEED = 1234
BATCH_SEED = 1000  # global batch k is drawn from seed BATCH_SEED + k
LR = 1e-2  # large enough that three steps move every parameter visibly
# Tolerances as in tests/test_exec_plans.py, which explains them: AdamW eps=1e-4 bounds
# how much summation-order noise in tiny gradients can move a parameter.
EPS = 1e-4
RTOL = 1e-5
ATOL = 5e-6

GLOO_TIMEOUT_S = 60  # a collective one rank never joins fails after this (a hang -> error)
CASE_LIMIT_S = 240  # a case with no result after this is a HANG; covers one gloo timeout
# How long a rank waits in the store for its peers to finish a case; the parent's
# CASE_LIMIT_S decides first, this only keeps an orphaned rank from waiting forever.
STORE_WAIT_S = 2 * CASE_LIMIT_S
POLL_S = 0.5  # how often the parent reads the ranks' progress files
# Substrings of the errors a rank sees when a PEER failed (it waited in a collective that
# the peer never joined, or the peer closed its connections): secondary, not the cause.
PEER_FAULT_MARKERS = ("timed out", "timeout", "connection closed", "connection reset",
                      "connection refused", "broken pipe")

PASS, REJECTED, MISMATCH, CRASH, HANG = "PASS", "REJECTED", "MISMATCH", "CRASH", "HANG"
BEFORE_TRAINING = ("not started", "load", "plan")  # stages before the first optimizer step


@dataclass(frozen=True)
class Case:
    arch: str
    mode: str
    world: int

    @property
    def key(self) -> str:
        return f"{self.arch}/{self.mode}/{self.world}r"


@dataclass(frozen=True)
class Outcome:
    case: Case
    status: str
    reason: str = ""
    seconds: float = 0.0
    plan: str = ""

    def to_dict(self) -> dict:
        return {"arch": self.case.arch, "mode": self.case.mode, "ranks": self.case.world,
                "outcome": self.status, "reason": self.reason,
                "seconds": round(self.seconds, 2), "plan": self.plan}


def cases(archs=ARCHS, modes=tuple(MODES), worlds=(2, 4)) -> list[Case]:
    return [Case(a, m, w) for w in worlds for a in archs for m in modes if w in MODE_WORLDS[m]]


# ----------------------------------------------------------------------------- models


def spec_of(arch: str) -> str:
    return f"hf:{os.path.join(CONFIG_DIR, arch, 'config.json')}"


def zero_dropout(module: nn.Module, config=None) -> nn.Module:
    """Dropout 0 everywhere: nn.Dropout modules, the float rates HF layers pass to
    F.dropout (attention_dropout, activation_dropout, layerdrop) and the config they
    read at forward time."""
    for sub in module.modules():
        if isinstance(sub, nn.Dropout):
            sub.p = 0.0
        for name, value in list(vars(sub).items()):
            if "drop" in name and isinstance(value, float):
                setattr(sub, name, 0.0)
    for cfg in {id(c): c for c in (config, getattr(module, "config", None)) if c}.values():
        for sub_cfg in [cfg] + [v for v in vars(cfg).values() if hasattr(v, "to_dict")]:
            for name, value in list(vars(sub_cfg).items()):
                if "drop" in name and isinstance(value, float):
                    setattr(sub_cfg, name, 0.0)
    return module


def build(arch: str, rows: int = EXAMPLE_ROWS, seed: int = SEED):
    """(module with dropout 0, inputs, target, loss_fn) built from `seed` on the CPU."""
    from planner.models import load_model

    loaded = load_model(spec_of(arch), micro_batch=rows, seq_len=SEQ_LEN, device="cpu",
                        seed=seed)
    return zero_dropout(loaded.module, loaded.config), loaded.inputs, loaded.target, loaded.loss_fn


def global_batches(arch: str) -> list:
    return [build(arch, GLOBAL_BATCH, BATCH_SEED + k)[1:3] for k in range(STEPS)]


def optimizer_kwargs() -> dict:
    return {"lr": LR, "weight_decay": 0.1, "eps": EPS}


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
    losses, state = train_one_device(model, loss_fn, batches, optimizer_kwargs())
    return {"batches": batches, "losses": losses, "state": state}


# ----------------------------------------------------------------------------- one rank


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def compare(losses: list[float], state: dict, ref: dict) -> dict:
    """Relative loss error per step and the worst parameter (by relative error norm)."""
    loss_rel = [abs(g - r) / max(abs(r), 1e-12) for g, r in zip(losses, ref["losses"])]
    worst = {"name": "", "rel": 0.0, "abs": 0.0, "ok": True}
    missing = [n for n in ref["state"] if n not in state]
    for name, expected in ref["state"].items():
        got = state.get(name)
        if got is None:
            continue
        if got.shape != expected.shape:
            return {"loss_rel": loss_rel, "missing": missing,
                    "param": {"name": name, "rel": float("inf"), "abs": float("inf"),
                              "ok": False, "shape": [list(got.shape), list(expected.shape)]}}
        error = got.double() - expected.double()
        norm = float(expected.double().norm())
        ok = float(error.norm()) <= RTOL * norm + ATOL and float(error.abs().max()) <= ATOL
        rel = float(error.norm()) / max(norm, 1e-12)
        if (not ok, rel) > (not worst["ok"], worst["rel"]):
            worst = {"name": name, "rel": rel, "abs": float(error.abs().max()), "ok": ok}
    return {"loss_rel": loss_rel, "missing": missing, "param": worst}


def run_case(case: Case, ref: dict, rank: int, log) -> dict:
    """On one rank: plan, shard, train and (rank 0) compare. Never raises."""
    from executors import full_state_dict
    from ir.errors import PlannerError
    from ir.strategy import Precision
    from planner.api import auto_parallel
    from planner.search_space import SearchOptions

    stage = "load"
    try:
        model, inputs, target, loss_fn = build(case.arch)
        stage = "plan"
        log("stage", stage=stage)
        try:
            options = SearchOptions(precision=Precision.FP32, **MODES[case.mode])
            pm = auto_parallel(model, (inputs, target), loss_fn=loss_fn,
                               optimizer=torch.optim.AdamW, optimizer_kwargs=optimizer_kwargs(),
                               cluster="local", global_batch=GLOBAL_BATCH,
                               precision=Precision.FP32, options=options)
        except PlannerError as exc:
            return {"state": "rejected", "stage": stage, "error": _first_line(exc)}
        plan = str(pm.plan)
        losses = []
        for step, batch in enumerate(ref["batches"]):
            stage = "train"
            log("stage", stage=f"train step {step + 1}")
            losses.append(pm.train_step(batch))
        stage = "gather"
        state = full_state_dict(pm.parallel)
        result = {"state": "ok", "stage": stage, "plan": plan, "losses": losses}
        if rank == 0:
            result["compare"] = compare(losses, state, ref)
        return result
    except Exception as exc:  # every failure is an outcome; the matrix goes on
        return {"state": "crash", "stage": stage, "error": _first_line(exc),
                "trace": traceback.format_exc(limit=-3)}


def rank_main(rank: int, world: int, port: int, log_dir: str, work: list) -> None:
    """One rank of a group: every case in `work` [(index, case, reference)], in order."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    with open(os.path.join(log_dir, f"rank{rank}.out"), "w") as sink:  # warnings, not the console
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                          timeout=timedelta(seconds=STORE_WAIT_S))
    with open(os.path.join(log_dir, f"rank{rank}.jsonl"), "a") as out:
        for index, case, ref in work:
            def log(event, **fields):
                out.write(json.dumps({"index": index, "event": event, "t": time.time(),
                                      **fields}) + "\n")
                out.flush()

            log("start")
            dist.init_process_group("gloo", store=dist.PrefixStore(f"case{index}", store),
                                    rank=rank, world_size=world,
                                    timeout=timedelta(seconds=GLOO_TIMEOUT_S))
            result = run_case(case, ref, rank, log)
            # Every rank has left the case's collectives before anyone tears gloo down.
            store.set(f"done/{index}/{rank}", "1")
            store.wait([f"done/{index}/{r}" for r in range(world)],
                       timedelta(seconds=STORE_WAIT_S))
            log("done", **result)
            dist.destroy_process_group()
            gc.collect()


# ----------------------------------------------------------------------------- outcomes


def _peer_fault(error: str) -> bool:
    return any(marker in error.lower() for marker in PEER_FAULT_MARKERS)


def classify(case: Case, results: list[dict], seconds: float = 0.0) -> Outcome:
    """One outcome from every rank's result of a case."""
    plan = next((r.get("plan", "") for r in results if r.get("plan")), "")
    failed = [(rank, r) for rank, r in enumerate(results) if r["state"] != "ok"]
    if failed:
        if all(r["state"] == "rejected" for r in results):
            return Outcome(case, REJECTED, results[0]["error"], seconds)
        causes = [(rank, r) for rank, r in failed if not _peer_fault(r["error"])] or failed
        rank, r = causes[0]
        when = "before training" if r["stage"] in BEFORE_TRAINING else "during training"
        if all(_peer_fault(f["error"]) for _, f in failed):
            return Outcome(case, HANG, f"collectives timed out at {r['stage']} ({when}): "
                                       f"{r['error']}", seconds, plan)
        if r["state"] == "rejected":
            ranks = [k for k, f in failed if f["state"] == "rejected"]
            return Outcome(case, CRASH, f"rejected on ranks {ranks} only ({when}): "
                                        f"{r['error']}", seconds, plan)
        return Outcome(case, CRASH, f"{when}, {r['stage']}, rank {rank}: {r['error']}",
                       seconds, plan)
    cmp = results[0]["compare"]
    step, worst = max(enumerate(cmp["loss_rel"]), key=lambda s: s[1])
    if worst > RTOL:
        return Outcome(case, MISMATCH, f"loss rel diff {worst:.1e} at step {step + 1}",
                       seconds, plan)
    if cmp["missing"]:
        return Outcome(case, MISMATCH, f"{len(cmp['missing'])} parameters missing, e.g. "
                                       f"{cmp['missing'][0]}", seconds, plan)
    param = cmp["param"]
    if not param["ok"]:
        return Outcome(case, MISMATCH, f"param {param['name']}: rel diff {param['rel']:.1e}, "
                                       f"max abs {param['abs']:.1e}", seconds, plan)
    return Outcome(case, PASS, "", seconds, plan)


# ----------------------------------------------------------------------------- groups


def _read_log(path: str) -> dict[int, dict]:
    """index -> {"start": t, "stage": last stage, "done": result, "done_t": t}."""
    cases_seen: dict[int, dict] = {}
    if not os.path.exists(path):
        return cases_seen
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a line still being written
            event = json.loads(line)
            entry = cases_seen.setdefault(event["index"], {"stage": "load"})
            if event["event"] == "start":
                entry["start"] = event["t"]
            elif event["event"] == "stage":
                entry["stage"] = event["stage"]
            else:
                entry["done"], entry["done_t"] = event, event["t"]
    return cases_seen


def _stopped(case: Case, logs: list[dict], index: int, dead: list, since: float) -> Outcome:
    """The outcome of the case a group was stopped in: a rank died, or time ran out."""
    stages = {rank: log.get(index, {}).get("stage", "not started") for rank, log in enumerate(logs)}
    seconds = time.time() - since
    if dead:
        rank, code = dead[0]
        stage = stages[rank]
        when = "before training" if stage in BEFORE_TRAINING else "during training"
        return Outcome(case, CRASH, f"{when}, {stage}, rank {rank}: process died "
                                    f"(exit code {code})", seconds)
    where = ", ".join(f"rank {r}: {s}" for r, s in stages.items())
    return Outcome(case, HANG, f"no result within {CASE_LIMIT_S} s ({where})", seconds)


def run_group(world: int, work: list, progress=None) -> dict[int, Outcome]:
    """Run `work` [(index, case, reference)] on `world` spawned ranks; a group that dies
    or stalls is killed and a new one takes the remaining cases."""
    import tempfile

    from dist_utils import free_port

    outcomes: dict[int, Outcome] = {}
    pending = list(work)
    context = multiprocessing.get_context("spawn")
    while pending:
        log_dir = tempfile.mkdtemp(prefix=f"real-models-{world}r-")
        paths = [os.path.join(log_dir, f"rank{r}.jsonl") for r in range(world)]
        port = free_port()
        procs = [context.Process(target=rank_main, daemon=True,
                                 args=(r, world, port, log_dir, pending)) for r in range(world)]
        for p in procs:
            p.start()
        since = time.time()  # when the current case could first start
        while True:
            time.sleep(POLL_S)
            logs = [_read_log(p) for p in paths]
            for index, case, _ in pending:
                if index in outcomes or not all("done" in log.get(index, {}) for log in logs):
                    continue
                first = logs[0][index]
                outcomes[index] = classify(case, [log[index]["done"] for log in logs],
                                           first["done_t"] - first.get("start", since))
                since = max(log[index]["done_t"] for log in logs)
                if progress:
                    progress(outcomes[index])
            remaining = [w for w in pending if w[0] not in outcomes]
            if not remaining:
                for p in procs:
                    p.join()
                pending = []
                break
            index, case, _ = remaining[0]
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if not p.is_alive()]
            if dead or time.time() - since > CASE_LIMIT_S:
                for p in procs:
                    if p.is_alive():
                        p.kill()
                    p.join()
                outcomes[index] = _stopped(case, logs, index, dead, since)
                if progress:
                    progress(outcomes[index])
                pending = remaining[1:]
                break
    return outcomes


# ----------------------------------------------------------------------------- the matrix


def run_matrix(selected: list[Case], progress=None) -> list[Outcome]:
    """Every case's outcome, in the order given. References run here, once per arch."""
    refs: dict[str, dict] = {}
    failed: dict[str, str] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run
    try:
        for arch in dict.fromkeys(c.arch for c in selected):
            try:
                build(arch)
            except Exception as exc:  # the ranks would fail the same way: no group needed
                failed[arch] = f"before training, load: {_first_line(exc)}"
                continue
            refs[arch] = reference(arch)
    finally:
        torch.set_num_threads(threads)
    outcomes: dict[int, Outcome] = {}
    for index, case in enumerate(selected):
        if case.arch in failed:
            outcomes[index] = Outcome(case, CRASH, failed[case.arch])
            if progress:
                progress(outcomes[index])
    for world in sorted({c.world for c in selected}):
        work = [(i, c, refs[c.arch]) for i, c in enumerate(selected)
                if c.world == world and c.arch in refs]
        if work:
            outcomes.update(run_group(world, work, progress))
    return [outcomes[i] for i in range(len(selected))]


PASS_RATE_TARGET = 0.9  # issue 14: at least 90% of runs pass


def missed_targets(outcomes: list[Outcome]) -> list[str]:
    """Issue 14's targets that these outcomes miss (empty: all met)."""
    missed = []
    for status in (MISMATCH, CRASH, HANG):
        bad = [o.case.key for o in outcomes if o.status == status]
        if bad:
            missed.append(f"{len(bad)} {status}: {', '.join(bad)}")
    passed = sum(o.status == PASS for o in outcomes)
    if outcomes and passed < PASS_RATE_TARGET * len(outcomes):
        missed.append(f"{passed}/{len(outcomes)} pass ({100 * passed / len(outcomes):.0f}%), "
                      f"target {100 * PASS_RATE_TARGET:.0f}%")
    auto_failed = sorted({o.case.arch for o in outcomes
                          if o.case.mode == "auto" and o.status != PASS})
    if auto_failed:
        missed.append(f"auto mode fails on {len(auto_failed)} architectures: "
                      f"{', '.join(auto_failed)}")
    return missed


def format_table(outcomes: list[Outcome]) -> str:
    """A grid arch x (mode, ranks) of outcomes, then one line per case with its reason."""
    columns = list(dict.fromkeys((o.case.mode, o.case.world) for o in outcomes))
    cell = {(o.case.arch, o.case.mode, o.case.world): o for o in outcomes}
    archs = list(dict.fromkeys(o.case.arch for o in outcomes))
    heads = [f"{m}@{w}r" for m, w in columns]
    width = max(len(a) for a in archs)
    lines = [f"{'arch':<{width}}  " + "  ".join(f"{h:<10}" for h in heads)]
    for arch in archs:
        row = [cell[(arch, m, w)].status if (arch, m, w) in cell else "-" for m, w in columns]
        lines.append(f"{arch:<{width}}  " + "  ".join(f"{s:<10}" for s in row))
    counts = {s: sum(o.status == s for o in outcomes) for s in (PASS, REJECTED, MISMATCH,
                                                                 CRASH, HANG)}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + f" of {len(outcomes)} runs")
    lines.append("")
    lines.append(f"{'case':<28} {'outcome':<9} {'s':>6}  reason / plan")
    for o in outcomes:
        detail = o.reason or o.plan
        lines.append(f"{o.case.key:<28} {o.status:<9} {o.seconds:>6.1f}  {detail}")
    return "\n".join(lines)
