"""Predicted vs measured per-rank peak memory and iteration time of executed plans.

The closed loop on this machine: `planner profile-cluster --nproc N` measures a cluster
spec for each process count N the cases use (collectives, one-thread matmul and copy
rates, per-op framework overhead, DTensor and data-parallel-unit overheads); each case
plans a zoo tiny model on that spec (`planner plan --cluster spec.json`, strategy
pinned by flags), then `planner validate` runs it on N spawned gloo ranks: per-rank peak
live tensor bytes (LiveTensorTracker) against the plan's prediction without the runtime
overhead, and the median step time against the predicted iteration time. Targets
(issue 6): memory within 5% on every rank, time within 25%.

    .venv/bin/python bench/bench_validate.py [--steps 5] [--rounds 3] [--cases gpt-ddp2,llama-tp2]
        [--work-dir DIR]   # keep specs and plans there; re-plan on the same specs next time

Every case is validated `--rounds` times round-robin and its measured time is the median
of the rounds' medians: on a shared 2-core machine the same run moves 20-50% between
minutes, and one round samples one moment. Each run also reads the machine's per-op
speed against the profile's (`machine_slowdown`): a case that misses while the machine
runs 1.4x slower than when it was profiled is machine drift, not a model error.

The run-queue wait is read too (`planner.trial.records.unqueued_step_seconds`): at load
12-22 on 2 cores (2026-11-26) a rank's main thread waited for a core for most of a
step, which no cost model prices; the table shows the step without it beside the wall,
and the busiest rank's CPU (a floor). Read then, same spec and plans, --rounds 2: wall
error gpt-ddp2 -54%, cnn-1rank -65%, mlp-1rank -53%, gpt-1rank -53%; without the waits
-23% (CPU floor 44.7 ms under the predicted 54.9), -9%, +5%, +6%. Those CPU floors
read schedstat's CPU field, which lags a running thread by up to a 4 ms tick: one-rank
steps seemed 1-4 ms off their core; read up to date (`planner.trial.sched`) a one-rank
step's wall is its CPU plus its wait, to 0.03 ms (`bench/bench_offcore.py`).

Prints a table (with the predicted time's parts: compute/tp/dp/pp/bubble/optimizer) and
writes bench/results/validate.json; exits 1 when a case fails or misses a target, or
when profiling fails twice (a fit the readings did not determine: issue 17).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from cost_models.profile_cluster import profile_cluster  # noqa: E402
from ir.cluster import ClusterSpec  # noqa: E402
from ir.errors import PlannerError  # noqa: E402
from planner.cli import main as planner_main  # noqa: E402
from planner.fmt import table  # noqa: E402
from planner.train_loop_probe import with_train_loop  # noqa: E402
from planner.trial.run import validate_plan  # noqa: E402

SPECS: dict[int, dict] = {}  # the measured specs, written into the JSON
# The predicted time's parts the table shows (`TimeBreakdown.to_json` keys), to tell which
# part a missed case lacks (issue 17: gpt-ddp2's gradient all-reduces)
BREAKDOWN = ("compute", "tp_comm", "dp_comm", "pp_comm", "bubble", "optimizer")
BREAKDOWN_SHORT = ("comp", "tp", "dp", "pp", "bub", "opt")
MEMORY_TARGET = 0.05
TIME_TARGET = 0.25
GLOBAL_BATCH = 8
# Largest message profile-cluster times. The tiny models' biggest collective is < 1 MiB,
# but the bandwidth must come from messages whose volume outweighs the start-up: at load
# 8-15 a 4-rank all-gather took ~4.4 ms whatever its size up to 4 MiB (issue 17), and
# profile-cluster refuses a fit its data do not determine.
PROFILE_MAX_BYTES = 16 << 20
# Sharded DLRM (issue 18): 8 tables of 100K x 64 fp32 (25.6 MB each), 4 ids per table per
# sample, at a global batch of 64 (2 samples a rank say nothing of the exchanges); the
# tables' shardings pinned by `planner plan-tables --sharding` (ranks still searched).
DLRM = "dlrm:num_tables=8,rows_per_table=100000,embedding_dim=64,lookups_per_table=4"
DLRM_PINS = ["--global-batch", "64", "--sharding"]  # the later --global-batch wins
# name -> (model, ranks, `planner plan` pins[, the planning subcommand, default "plan"])
CASES = {
    "gpt-1rank": ("gpt-tiny", 1, ["--uniform"]),
    "gpt-ddp2": ("gpt-tiny", 2, ["--uniform", "--dp", "2", "--zero", "0"]),
    "gpt-zero3x2": ("gpt-tiny", 2, ["--uniform", "--dp", "2", "--zero", "3"]),
    "gpt-zero1x2": ("gpt-tiny", 2, ["--uniform", "--dp", "2", "--zero", "1"]),
    "gpt-zero1x2-bf16": ("gpt-tiny", 2, ["--uniform", "--dp", "2", "--zero", "1",
                                         "--precision", "bf16-mixed"]),
    # not --uniform: SP runs on the blocks only, so no one strategy fits every layer
    "gpt-tp2-dp2-sp": ("gpt-tiny", 4, ["--tp", "2", "--dp", "2", "--sequence-parallel"]),
    "gpt-pp2-dp2-zero1": ("gpt-tiny", 4, ["--uniform", "--pp", "2", "--dp", "2", "--zero", "1"]),
    "gpt-tp2-pp2-dp2": ("gpt-tiny", 8, ["--uniform", "--tp", "2", "--pp", "2", "--dp", "2",
                                        "--zero", "1"]),
    "llama-tp2": ("llama-tiny", 2, ["--uniform", "--tp", "2", "--dp", "1"]),
    "llama-zero2x4-ckpt": ("llama-tiny", 4, ["--uniform", "--dp", "4", "--zero", "2",
                                             "--checkpoint", "full"]),
    "llama-tp4-dp2": ("llama-tiny", 8, ["--uniform", "--tp", "4", "--dp", "2"]),
    "bert-ddp2": ("bert-tiny", 2, ["--uniform", "--dp", "2", "--zero", "0"]),
    "t5-zero3x2": ("t5-tiny", 2, ["--uniform", "--dp", "2", "--zero", "3"]),
    "mlp-ddp4": ("mlp-small", 4, ["--uniform", "--dp", "4", "--zero", "0"]),
    # a first layer fed by the data (no input gradient in a step): a conv stem, a Linear
    "cnn-1rank": ("cnn-small", 1, ["--uniform"]),
    "mlp-1rank": ("mlp-small", 1, ["--uniform"]),
    # checkpointing variants (issue 17): selective and full on 1, 2 and 4 processes
    "gpt-1rank-sel": ("gpt-tiny", 1, ["--uniform", "--checkpoint", "selective"]),
    "gpt-1rank-full": ("gpt-tiny", 1, ["--uniform", "--checkpoint", "full"]),
    "gpt-ddp2-sel": ("gpt-tiny", 2, ["--uniform", "--dp", "2", "--zero", "0",
                                     "--checkpoint", "selective"]),
    "llama-tp2-sel": ("llama-tiny", 2, ["--uniform", "--tp", "2", "--dp", "1",
                                        "--checkpoint", "selective"]),
    "llama-tp2-full": ("llama-tiny", 2, ["--uniform", "--tp", "2", "--dp", "1",
                                         "--checkpoint", "full"]),
    "gpt-tp2-dp2-sp-sel": ("gpt-tiny", 4, ["--tp", "2", "--dp", "2", "--sequence-parallel",
                                           "--checkpoint", "selective"]),
    "gpt-tp2-dp2-sp-full": ("gpt-tiny", 4, ["--tp", "2", "--dp", "2", "--sequence-parallel",
                                            "--checkpoint", "full"]),
    "llama-zero2x4-sel": ("llama-tiny", 4, ["--uniform", "--dp", "4", "--zero", "2",
                                            "--checkpoint", "selective"]),
    # sharded tables (issue 18): table-wise, row-wise (key ranges), and a mixed placement
    "dlrm-tw4": (DLRM, 4, [*DLRM_PINS, "table_wise"], "plan-tables"),
    "dlrm-rw4": (DLRM, 4, [*DLRM_PINS, "row_range"], "plan-tables"),
    "dlrm-mixed4": (DLRM, 4, [*DLRM_PINS, "table_wise,row_range,column_wise,replicated"],
                    "plan-tables"),
}


def profile_specs(process_counts: set[int], folder: str) -> dict[int, str]:
    """A measured spec per process count; one process reuses the two-process spec (its
    compute and overhead figures; it has no collectives). A spec already in `folder`
    (`--work-dir`) is reused, not measured again."""
    specs = {}
    for n in sorted({max(2, n) for n in process_counts}):
        path = os.path.join(folder, f"spec{n}.json")
        if os.path.exists(path):
            spec = ClusterSpec.load(path)
            print(f"... reusing {path}", file=sys.stderr, flush=True)
        else:
            spec = _measure_spec(n, path)
        dp = [r for r in spec.calibration.dp_overheads if r.group_size is not None]
        print(f"... spec of {n} processes: op {spec.op_overhead_s * 1e6:.1f} us, DTensor "
              f"+{spec.dtensor_op_overhead_s * 1e6:.1f} us, DP unit "
              f"{ {(str(r.mode), r.group_size): round(r.per_unit_s * 1e3, 2) for r in dp} } ms "
              f"+ per tensor "
              f"{ {(str(r.mode), r.group_size): round(r.per_tensor_s * 1e3, 3) for r in dp} } ms, "
              "TP module "
              f"{ {r.group_size: round(r.seconds * 1e3, 2) for r in spec.calibration.tp_modules} } ms, "
              f"all-reduce alpha {spec.intra_node_latency_s * 1e6:.0f} us; per TP group size "
              "(forward, backward) vocab embedding "
              f"{_ms_pairs(spec.calibration.vocab_embedding_seconds, spec)} ms, loss-parallel "
              f"{_ms_pairs(spec.calibration.loss_parallel_seconds, spec)} ms, SAC (module, "
              f"SP group) {_ms_pairs(spec.calibration.selective_seconds, spec)} ms, SAC per "
              "SP group of a whole block (both passes, forward) "
              f"{_ms_pairs(spec.calibration.sp_block_selective_seconds, spec)} ms",
              file=sys.stderr, flush=True)
        specs[n] = path
        SPECS[n] = spec.to_dict()
    specs[1] = specs.get(2) or next(iter(specs.values()))
    return specs


def _ms_pairs(lookup, spec: ClusterSpec) -> dict:
    """{TP group size: the spec's pair of figures in ms} for the sizes it measured TP at."""
    sizes = sorted({r.group_size for r in spec.calibration.tp_modules})
    return {size: tuple(round(s * 1e3, 2) for s in lookup(size) or ()) for size in sizes}


def _measure_spec(n: int, path: str) -> ClusterSpec:
    """`planner profile-cluster` on n processes, written to `path`."""
    try:
        spec, _ = profile_cluster(n, "gloo", max_bytes=PROFILE_MAX_BYTES, name=f"local-{n}")
    except PlannerError as exc:  # a worker can die on a busy machine: one more try
        print(f"... profiling {n} processes failed ({exc}); retrying", file=sys.stderr)
        spec, _ = profile_cluster(n, "gloo", max_bytes=PROFILE_MAX_BYTES, name=f"local-{n}")
    spec = with_train_loop(spec)  # as `planner profile-cluster` writes it
    spec.save(path)
    return spec


def plan_case(name: str, folder: str, spec: str) -> str:
    model, ranks, pins, *command = CASES[name]
    path = os.path.join(folder, f"{name}.json")
    with contextlib.redirect_stdout(io.StringIO()):
        status = planner_main([*(command or ["plan"]), model, "--cluster", spec,
                               "--gpus-per-node", str(ranks),
                               "--global-batch", str(GLOBAL_BATCH), *pins, "--out", path])
    if status:
        raise SystemExit(f"{name}: planner plan failed with status {status}")
    return path


def run_case(name: str, steps: int, path: str) -> dict:
    start = time.perf_counter()
    result = validate_plan(path, CASES[name][1], steps=steps)
    out = result.to_json()
    out.update(case=name, wall_seconds=time.perf_counter() - start,
               worst_memory_error=max((r.error for r in result.ranks), key=abs))
    return out


def phase_row(r: dict) -> list:
    """One sharded-table case's phase split (first round, mean over ranks) beside the
    prediction: all-to-alls and dense collectives after the last arrival and waiting,
    replicated tables' gathers, and the tables' host work (lookups and sparse step without
    their all-to-alls)."""
    ranks = r["phase_seconds"]

    def mean(key: str) -> float:
        return statistics.fmean(p.get(key, 0.0) for p in ranks)

    a2a = ("a2a_forward", "a2a_backward", "a2a_optimizer")
    emb = r["predicted_embedding"]["ranks"]
    return [r["case"], f"{mean('a2a_calls'):.0f}",
            f"{1e3 * sum(mean(f'{k}_after_arrival_s') for k in a2a):.1f} + "
            f"{1e3 * sum(mean(f'{k}_wait_s') for k in a2a):.1f}",
            f"{1e3 * mean('replicated_gathers_s'):.1f}",
            f"{1e3 * max(x['comm_s'] for x in emb):.1f}",
            f"{mean('dense_calls'):.0f}", f"{mean('dense_bytes') / 2**10:.1f}",
            f"{1e3 * mean('dense_comm_after_arrival_s'):.1f} + "
            f"{1e3 * mean('dense_comm_wait_s'):.1f}",
            f"{1e3 * r['predicted_time']['dp_comm']:.1f}",
            f"{1e3 * (mean('lookup_host_s') + mean('sparse_step_s') - mean('a2a_optimizer_s')):.1f}",
            f"{1e3 * max(x['lookup_s'] + x['update_s'] for x in emb):.1f}"]


def merge_rounds(runs: list[dict]) -> dict:
    """One case over its rounds: the median of the rounds' median step times (each round
    ran at another moment of a shared machine); memory and losses from the first round
    (they do not change between runs)."""
    out = dict(runs[0])
    measured = statistics.median(r["measured_iteration_seconds"] for r in runs)
    unqueued = [r["measured_unqueued_seconds"] for r in runs
                if r.get("measured_unqueued_seconds")]
    cpu = [r["measured_busiest_cpu_seconds"] for r in runs
           if r.get("measured_busiest_cpu_seconds")]
    if cpu:  # the busiest rank's CPU: a floor of the step on idle cores
        out.update(measured_busiest_cpu_seconds=statistics.median(cpu))
    if unqueued:  # the step less waiting for a core (planner.trial.records)
        out.update(measured_unqueued_seconds=statistics.median(unqueued),
                   unqueued_time_error=out["predicted_iteration_seconds"]
                   / statistics.median(unqueued) - 1)
    out.update(measured_iteration_seconds=measured,
               round_seconds=[r["measured_iteration_seconds"] for r in runs],
               machine_slowdown_by_round=[r["machine_slowdown"] for r in runs],
               time_error=out["predicted_iteration_seconds"] / measured - 1,
               loss_matches_reference=all(r["loss_matches_reference"] for r in runs),
               # planner.trial.grad_check: each layer's first-step gradient norm (absent: fp16)
               grad_norms_match_reference=all(r.get("grad_norms_match_reference", True)
                                              for r in runs),
               wall_seconds=sum(r["wall_seconds"] for r in runs))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=3,
                        help="validate every case this many times, round-robin (3)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "validate.json"))
    parser.add_argument("--work-dir", default=None,
                        help="keep the specs and plans in this folder; a spec<N>.json "
                             "already there is reused, not re-profiled (default: a "
                             "temporary folder)")
    args = parser.parse_args(argv)
    results, rows, failed = [], [], []
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; known: {', '.join(CASES)}")
    with contextlib.ExitStack() as stack:
        folder = args.work_dir or stack.enter_context(tempfile.TemporaryDirectory())
        os.makedirs(folder, exist_ok=True)
        try:
            specs = profile_specs({CASES[n][1] for n in names}, folder)
        except PlannerError as exc:  # twice: the machine is too busy to measure
            print(f"bench_validate: {exc}", file=sys.stderr)
            return 1
        paths, runs = {}, {}
        for name in names:
            try:
                paths[name] = plan_case(name, folder, specs[CASES[name][1]])
            except (SystemExit, Exception) as exc:
                print(f"... {name}: FAILED to plan ({exc})", file=sys.stderr, flush=True)
                failed.append({"case": name, "error": str(exc)})
        for round_index in range(args.rounds):  # round-robin: each case at several moments
            for name in paths:
                if any(f["case"] == name for f in failed):
                    continue
                try:
                    r = run_case(name, args.steps, paths[name])
                except (SystemExit, Exception) as exc:  # one failed case does not stop the rest
                    print(f"... {name}: FAILED ({exc})", file=sys.stderr, flush=True)
                    failed.append({"case": name, "error": str(exc)})
                    continue
                runs.setdefault(name, []).append(r)
                print(f"... round {round_index + 1}: {name} "
                      f"{1e3 * r['measured_iteration_seconds']:.1f} ms in {r['wall_seconds']:.0f} s"
                      f" (ops at x{r['machine_slowdown']:.2f} the profile's time)",
                      file=sys.stderr, flush=True)
        for name, case_runs in runs.items():
            if any(f["case"] == name for f in failed):
                continue
            r = merge_rounds(case_runs)
            results.append(r)
            mem_ok = abs(r["worst_memory_error"]) <= MEMORY_TARGET
            time_ok = abs(r["time_error"]) <= TIME_TARGET
            measured = [x["measured_peak_bytes"] for x in r["ranks"]]
            predicted = [x["predicted_peak_bytes"] for x in r["ranks"]]
            rows.append([name, r["nproc"], r["plan"].replace("plan(", "").rstrip(")"),
                         f"{min(predicted) / 2**20:.2f}-{max(predicted) / 2**20:.2f}",
                         f"{min(measured) / 2**20:.2f}-{max(measured) / 2**20:.2f}",
                         f"{100 * r['worst_memory_error']:+.1f}%", "yes" if mem_ok else "NO",
                         f"{1e3 * r['predicted_iteration_seconds']:.1f}",
                         "/".join(f"{1e3 * r['predicted_time'].get(k, 0.0):.1f}"
                                  for k in BREAKDOWN),
                         "/".join(f"{1e3 * x:.0f}" for x in r["round_seconds"]),
                         f"{1e3 * r['measured_iteration_seconds']:.1f}",
                         f"{100 * r['time_error']:+.0f}%", "yes" if time_ok else "NO",
                         *((f"{1e3 * r['measured_unqueued_seconds']:.1f}",
                            f"{100 * r['unqueued_time_error']:+.0f}%")
                           if "measured_unqueued_seconds" in r else ("", "")),
                         f"{1e3 * r['measured_busiest_cpu_seconds']:.1f}"
                         if "measured_busiest_cpu_seconds" in r else "",
                         "yes" if r["loss_matches_reference"] else "NO",
                         "yes" if r["grad_norms_match_reference"] else "NO"])
    print(f"planner validate: predicted vs measured, {GLOBAL_BATCH} samples per step (dlrm: 64), fp32 "
          f"AdamW, gloo on this machine (targets: memory {MEMORY_TARGET:.0%} per rank, time "
          f"{TIME_TARGET:.0%})")
    print(table(["case", "ranks", "plan", "pred MiB", "meas MiB", "worst mem err", "mem ok",
                 "pred ms", "pred " + "/".join(BREAKDOWN_SHORT), "rounds ms", "meas ms",
                 "time err", "time ok", "w/o runq ms", "err w/o runq", "CPU ms",
                 "loss = ref", "grads = ref"], rows,
                right={1, 3, 4, 5, 7, 8, 9, 10, 11, 13, 14, 15}))
    print("w/o runq: each step less the time a rank's main thread waited for a core (the "
          "other processes' load; /proc schedstat), the largest over ranks; a rank's wait "
          "on a queued peer stays in (an upper bound on idle cores). CPU: the busiest "
          "rank's main-thread CPU (a floor: collectives' blocked time is not CPU). "
          "Informative, not judged")
    phase_rows = [phase_row(r) for r in results if r.get("phase_seconds")]
    if phase_rows:
        print("sharded-table steps, mean over ranks (executors.phase_clock): each collective "
              "kind's ms after the last rank arrived + ms waiting for it, against the model")
        print(table(["case", "a2a calls", "a2a ms + wait", "gathers ms", "pred a2a+gathers ms",
                     "dense calls", "dense KiB", "dense ms + wait", "pred dp ms",
                     "table host ms", "pred lookup+update ms"], phase_rows,
                    right=set(range(1, 11))))
    mem_within = sum(abs(r["worst_memory_error"]) <= MEMORY_TARGET for r in results)
    time_within = sum(abs(r["time_error"]) <= TIME_TARGET for r in results)
    print(f"memory within {MEMORY_TARGET:.0%} on every rank: {mem_within} of {len(results)}; "
          f"time within {TIME_TARGET:.0%}: {time_within} of {len(results)} (median of "
          f"{args.rounds} rounds)"
          + (f"; failed: {', '.join(f['case'] for f in failed)}" if failed else ""))
    if results:  # each round's median over its cases
        by_round = [statistics.median(r["machine_slowdown_by_round"][k] for r in results)
                    for k in range(len(results[0]["machine_slowdown_by_round"]))]
        print("ops ran at x" + ", x".join(f"{x:.2f}" for x in by_round) + " the profile's "
              "per-op time (median per round; above 1: the machine was slower than profiled)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"bench": "validate", "torch": torch.__version__, "host": platform.node(),
                   "cpus": os.cpu_count(), "memory_target": MEMORY_TARGET,
                   "time_target": TIME_TARGET, "specs": SPECS, "cases": results,
                   "failed": failed}, fh, indent=2)
    print(f"wrote {args.out}")
    numerics_ok = all(r["loss_matches_reference"] and r["grad_norms_match_reference"]
                      for r in results)
    # the stated targets: every case runs, within both on every case, equal to one device
    return 0 if not failed and numerics_ok and mem_within == time_within == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
