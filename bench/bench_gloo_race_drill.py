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
        [--builds cpu,meta] [--steps 10]

Each round builds the model (alternating CPU and meta builds), applies the plan, trains
--steps passes over test_exec_plans' 3 batches and gathers the full state; ranks agree on
rank 0's clock whether to start another round, so the drill ends after --seconds (plus
the last round). Every round's losses must equal the first round's of the same build
bit for bit (the same seed, batches and reduction order: a race that let gloo write into
freed or emptied memory would show here before it crashed), and no rank may die. Each
rank writes a faulthandler dump of all its threads on a fatal signal to
bench/results/gloo_race_drill/rank<r>.fault. Writes bench/results/gloo_race_drill.json;
exits 1 on a dead rank or a differing loss.
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
JOIN_SLACK_S = 600  # past --seconds: the last round, and the group's start on a loaded host


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


def _drill_rank(rank: int, world_size: int, payload: dict) -> dict:
    import faulthandler
    import gc

    from executors import full_state_dict

    fault = open(os.path.join(FAULT_DIR, f"rank{rank}.fault"), "w")
    faulthandler.enable(file=fault, all_threads=True)
    start, rounds = time.monotonic(), []
    first: dict[str, list[float]] = {}
    while True:
        go = torch.tensor([float(time.monotonic() - start < payload["seconds"])])
        dist.broadcast(go, 0)  # rank 0's clock decides, so every rank stops together
        if not go.item():
            break
        build = payload["builds"][len(rounds) % len(payload["builds"])]
        pm, batches = _applied(build)
        losses = [pm.train_step(inputs, target) for _ in range(payload["steps"])
                  for inputs, target in batches]
        params = len(full_state_dict(pm))
        first.setdefault(build, losses)
        rounds.append({"build": build, "same": losses == first[build], "params": params,
                       "steps": len(losses)})
        del pm
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
