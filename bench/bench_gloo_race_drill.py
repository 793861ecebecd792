"""A stress drill, not a timing: test_exec_plans' 4-rank "dp-tp" case (llama-tiny, dp 2 x
tp 2, ZeRO-3) trained over and over on spawned gloo ranks while CPU hogs compete for the
cores, looking for a rank that dies or a step that computes differently.

Why: a CI run had a rank die with SIGSEGV in that group (tests/test_exec_meta.py
[4r-dp-tp]; not reproduced since). Its ZeRO-3 units run `ir.gloo_collectives`
(a CPU build) or the host rings of `executors.host_collectives` (a meta build, the lean
path), both of which empty (`.set_()`) tensors that gloo's worker thread still holds
references to: if one were emptied or freed while gloo still read or wrote it, a rank
would crash or sum garbage, more likely when the scheduler delays gloo's threads.

    .venv/bin/python bench/bench_gloo_race_drill.py [--seconds 240] [--hogs 2]
        [--builds cpu,meta | --builds group | --builds collectives] [--steps 10]

Each round builds the model (alternating CPU and meta builds), applies the plan, trains
--steps passes over test_exec_plans' 3 batches and gathers the full state. A "group"
round runs instead every entry of the CI's 4-rank group as the tests do
(`test_exec_plans.run_cases` over its 4-rank cases and test_exec_meta's meta-built
twins): the crash was reported by test_exec_meta[4r-dp-tp], the first test to read that
group's results, so any of its entries may have been the one running. A "collectives"
round calls the case's collectives alone, COLLECTIVE_CALLS times each, on its mesh (dp 2
x tp 2, the two dp groups at once): `GlooAllGather` (synchronous and asynchronous),
`GlooReduceScatter`, the host rings and the tp group's all-reduce, at sizes from one
element a rank to a quarter MiB, each result checked exactly, each buffer dropped at
once and the memory refilled (so an emptied alias gloo still wrote to would corrupt a
later result or crash): thousands of calls a minute where a training round makes tens.
Ranks agree on
rank 0's clock whether to start another round, so the drill ends after --seconds (plus
the last round). Every round's losses must equal the first round's of the same build
bit for bit (the same seed, batches and reduction order: a race that let gloo write into
freed or emptied memory would show here before it crashed), and no rank may die. Each
rank writes a faulthandler dump of all its threads on a fatal signal to
bench/results/gloo_race_drill/rank<r>.fault. Writes bench/results/gloo_race_drill.json;
exits 1 on a dead rank or a differing loss.

Read on 2026-11-26 (2 hogs, load 5-33), no rank died and nothing differed: 46
collectives rounds (9200 calls of each kind a rank, 271 s); 4 + 4 + 4 collectives, CPU
and meta rounds (225 s); 3 training rounds of dp-tp alone (135 steps); 5 group rounds
(90 entries, 270 steps, 475 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dist_utils import spawn  # noqa: E402

WORLD = 4  # the case's ranks: dp 2 x tp 2
CASE = "dp-tp"
FAULT_DIR = os.path.join(ROOT, "bench", "results", "gloo_race_drill")
JOIN_SLACK_S = 300  # past --seconds: the last round and a loaded start (a hang fails)


def _applied(build: str):
    """The case's model, built on CPU or on meta, with its plan applied; its batches."""
    from executors import apply
    from test_exec_meta import build_meta
    from test_exec_plans import (CASES, batches_of, build_model, graph_of,
                                 optimizer_kwargs)

    case = next(c for c in CASES if c.name == CASE and c.world == WORLD)
    graph = graph_of(case.model)
    model, loss_fn = (build_meta if build == "meta" else build_model)(case.model)
    pm = apply(model, case.plan(graph), graph, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
               optimizer_kwargs=optimizer_kwargs())
    return pm, batches_of(case.model)


# "collectives" rounds: calls of each kind per round, at CHUNK_NUMELS elements a rank
COLLECTIVE_CALLS = 200
CHUNK_NUMELS = (1, 257, 4099, 65537)


def _collective_round(mesh, calls: int) -> list[str]:
    """COLLECTIVE_CALLS of each of the case's collectives, checked; what came out wrong."""
    from executors.host_collectives import RingAllGather, RingReduceScatter
    from ir.gloo_collectives import GlooAllGather, GlooReduceScatter

    dp, tp = mesh["dp"].get_group(), mesh["tp"].get_group()
    n, r = dp.size(), dp.rank()
    wrong = []
    gathers = {"gloo": GlooAllGather(), "ring": RingAllGather()}
    scatters = {"gloo": GlooReduceScatter(), "ring": RingReduceScatter()}
    for call in range(calls):
        chunk = CHUNK_NUMELS[call % len(CHUNK_NUMELS)]
        tag = float(call % 7)
        for name, gather in gathers.items():
            for async_op in ((False, True) if name == "gloo" else (False,)):
                out = gather.allocate((n * chunk,), dtype=torch.float32,
                                      device=torch.device("cpu"))
                mine = out.view(n, chunk)[r]
                mine.fill_(r + 1 + tag)
                work = gather(out, mine, dp, async_op=async_op)
                if work is not None:
                    work.wait()
                want = (torch.arange(n, dtype=torch.float32) + 1 + tag).repeat_interleave(chunk)
                if not torch.equal(out, want):
                    wrong.append(f"{name} all-gather async={async_op} chunk {chunk}")
                del out, mine, work
                torch.full((n * chunk,), -1.0)  # reuse what was freed, at once
        for name, scatter in scatters.items():
            flat = torch.full((n * chunk,), r + 1 + tag)
            out = torch.empty(chunk)
            scatter(out, flat, dp)
            if not torch.equal(out, torch.full((chunk,), n * (n + 1) / 2 + n * tag)):
                wrong.append(f"{name} reduce-scatter chunk {chunk}")
            del flat, out
            torch.full((n * chunk,), -1.0)
        t = torch.full((chunk,), float(tp.rank() + 1))
        dist.all_reduce(t, group=tp)
        if not torch.equal(t, torch.full((chunk,), tp.size() * (tp.size() + 1) / 2)):
            wrong.append(f"tp all-reduce chunk {chunk}")
    return wrong


def _group_entries(rank: int) -> list[tuple]:
    """The CI's 4-rank group's `run_cases` entries (`test_exec_plans.results_for`), made
    once by rank 0 and sent to all: its "planned-*" plans come from a search on this
    machine's measured speed, which may pick another plan on another rank or round."""
    import test_exec_meta  # noqa: F401  (registers its meta-built entries)
    from test_exec_plans import CASES, GROUP_ENTRIES, batches_of, graph_of

    entries = [None]
    if rank == 0:
        entries[0] = [(c.name, c.model, c.plan(graph_of(c.model)), graph_of(c.model),
                       batches_of(c.model)) for c in CASES if c.world == WORLD]
        for more in GROUP_ENTRIES.get(WORLD, []):
            entries[0] += more()
    dist.broadcast_object_list(entries, src=0)
    return entries[0]


def _group_losses(rank: int, entries: list[tuple]) -> dict:
    """One run of the CI's 4-rank group: each entry's losses, or its refusal."""
    from test_exec_plans import run_cases

    got = run_cases(rank, WORLD, entries)
    return {name: r.get("losses", r.get("error")) if isinstance(r, dict) else None
            for name, r in got.items()}


def _drill_rank(rank: int, world_size: int, payload: dict) -> dict:
    import faulthandler
    import gc

    from executors import full_state_dict

    fault = open(os.path.join(FAULT_DIR, f"rank{rank}.fault"), "w")
    faulthandler.enable(file=fault, all_threads=True)
    from torch.distributed.device_mesh import init_device_mesh

    start, rounds = time.monotonic(), []
    first: dict[str, list[float]] = {}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))  # the case's
    entries = None  # the group's, made once
    while True:
        go = torch.tensor([float(time.monotonic() - start < payload["seconds"])])
        dist.broadcast(go, 0)  # rank 0's clock decides, so every rank stops together
        if not go.item():
            break
        build = payload["builds"][len(rounds) % len(payload["builds"])]
        if build == "collectives":
            losses = _collective_round(mesh, COLLECTIVE_CALLS)  # what came out wrong
            steps = COLLECTIVE_CALLS
        elif build == "group":
            entries = entries or _group_entries(rank)
            losses = _group_losses(rank, entries)
            steps = sum(len(v) for v in losses.values() if isinstance(v, list))
        else:
            pm, batches = _applied(build)
            losses = [pm.train_step(inputs, target) for _ in range(payload["steps"])
                      for inputs, target in batches]
            full_state_dict(pm)
            steps = len(losses)
            del pm
        first.setdefault(build, losses)
        same = not losses if build == "collectives" else losses == first[build]
        rounds.append({"build": build, "same": same, "steps": steps})
        gc.collect()
    faulthandler.disable()
    fault.close()
    return {"rounds": rounds, "first": first, "seconds": time.monotonic() - start}


def _hogs(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--builds", default="cpu,meta")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                      "gloo_race_drill.json"))
    args = parser.parse_args(argv)
    os.makedirs(FAULT_DIR, exist_ok=True)
    payload = {"seconds": args.seconds, "builds": args.builds.split(","),
               "steps": args.steps}
    load_before, hogs, began = os.getloadavg()[0], _hogs(args.hogs), time.monotonic()
    error = None
    try:
        results = spawn(_drill_rank, WORLD, payload, timeout_s=args.seconds + JOIN_SLACK_S)
    except Exception as exc:  # a dead rank (its signal), a hang, a rank's exception
        results, error = None, f"{type(exc).__name__}: {exc}"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    wall_s, load_after = time.monotonic() - began, os.getloadavg()[0]
    faults = {name: open(os.path.join(FAULT_DIR, name)).read()
              for name in sorted(os.listdir(FAULT_DIR))
              if os.path.getsize(os.path.join(FAULT_DIR, name))}
    record = {"bench": "gloo_race_drill", "torch": torch.__version__, "case": CASE,
              "hogs": args.hogs, "load": [load_before, load_after], "wall_s": wall_s,
              "error": error, "faults": faults}
    failed = [error] if error else []
    if results is not None:
        rounds = results[0]["rounds"]
        differing = [(r, i) for r, res in enumerate(results)
                     for i, rd in enumerate(res["rounds"]) if not rd["same"]]
        record.update(rounds=len(rounds), steps=sum(r["steps"] for r in rounds),
                      by_build={b: sum(r["build"] == b for r in rounds)
                                for b in payload["builds"]},
                      differing=differing, first_losses=results[0]["first"])
        if differing:
            failed.append(f"losses differ from the build's first round at (rank, round) "
                          f"{differing}")
        print(f"{WORLD} ranks, {args.hogs} hogs, load {load_before:.1f} -> {load_after:.1f}: "
              f"{len(rounds)} rounds ({record['by_build']}), {record['steps']} steps, "
              f"{wall_s:.0f} s; losses equal to each build's first round: "
              f"{'yes' if not differing else 'NO'}")
    if faults:
        failed.append(f"fatal-signal dumps from {sorted(faults)}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=2)
    print(f"wrote {args.out}" + (f"; FAILED: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
