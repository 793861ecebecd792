"""Issue 14's acceptance matrix: 21 Hugging Face architectures through `auto_parallel`.

Every architecture of real_models.ARCHS (its tiny config in tests/data/hf, random init,
fp32, dropout 0; --arch takes any other there too) on 2 and
4 gloo ranks in four modes: auto (the planner chooses), tp2, pp2 and tp2xpp2 (4 ranks).
Each run trains 3 AdamW steps and must equal single-process training within 1e-5, or be
rejected by auto_parallel before its first step (tests/real_models.py has the details).

Targets: no MISMATCH, no CRASH, no HANG; at least 90% PASS; every architecture passes
auto. The exit status is 1 when one is missed.

    .venv/bin/python bench/bench_real_models.py [--arch llama,opt] [--mode auto,tp2] [--ranks 2]

Prints a table and writes bench/results/real_models.json. Every run's record holds the
plan it ran ("plan": per-layer strategies, compact; "plan_json": the whole plan
document, measured cluster spec included) and the whole reason of a failure; each
REJECTED / MISMATCH / CRASH / HANG run is printed with both. Replay one case with the
plan it drew (the search reads measured speeds, so plans vary with load):

    .venv/bin/python bench/bench_real_models.py --only falcon/auto/4r \
        --plan bench/results/real_models.json      # that case's recorded plan
    .venv/bin/python bench/bench_real_models.py --only falcon/auto/4r --plan plan.json

(`--plan` takes a plan document, e.g. `planner plan --out`, or a results file.) A
replay writes bench/results/real_models_replay.json, leaving the matrix's record.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import real_models  # noqa: E402  (tests/ is not a package)
import real_models_groups  # noqa: E402


def _plan_text(path: str, key: str) -> str:
    """The plan JSON to replay `key` with: a plan document, or that case's recorded
    "plan_json" in a results file."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "runs" in data:
        recorded = [r.get("plan_json") for r in data["runs"] if r.get("key") == key]
        if not recorded or not recorded[0]:
            raise SystemExit(f"--plan {path}: no recorded plan for {key}; run the matrix "
                             "again or pass a plan document")
        return recorded[0]
    return json.dumps(data)


def _failures(outcomes) -> str:
    """Each run that did not pass: its whole reason and the plan it ran."""
    lines = []
    for o in outcomes:
        if o.status != real_models.PASS:
            lines += [f"{o.case.key} {o.status}: {o.reason}",
                      f"    plan: {o.plan or '(none: no plan was made)'}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", help="comma-separated architectures of tests/data/hf "
                                       "(default: the 21 of ARCHS)")
    parser.add_argument("--mode", help=f"comma-separated modes of {', '.join(real_models.MODES)}")
    parser.add_argument("--ranks", help="comma-separated world sizes (default: 2,4)")
    parser.add_argument("--only", help="one case, arch/mode/Nr (e.g. falcon/auto/4r)")
    parser.add_argument("--plan", help="with --only: run this plan (a plan JSON document, or a "
                                       "results file holding the case's record) instead of "
                                       "searching")
    args = parser.parse_args()
    if args.plan and not args.only:
        parser.error("--plan replays one case: give --only arch/mode/Nr too")
    if args.only:
        try:
            selected = [real_models.Case.parse(args.only)]
        except ValueError as exc:
            parser.error(str(exc))
        if args.plan:
            selected = [real_models.Case.parse(args.only, _plan_text(args.plan, args.only))]
    else:
        archs = args.arch.split(",") if args.arch else real_models.ARCHS
        modes = args.mode.split(",") if args.mode else tuple(real_models.MODES)
        worlds = tuple(int(w) for w in args.ranks.split(",")) if args.ranks else (2, 4)
        unknown = ([a for a in archs if a not in real_models.known_archs()]
                   + [m for m in modes if m not in real_models.MODES])
        if unknown:
            parser.error(f"unknown architecture or mode: {', '.join(unknown)}")
        selected = real_models.cases(archs, modes, worlds)
    start = time.monotonic()
    done = []

    def progress(outcome):
        done.append(outcome)
        print(f"[{len(done):>3}/{len(selected)} {time.monotonic() - start:6.0f} s] "
              f"{outcome.case.key:<28} {outcome.status}", file=sys.stderr, flush=True)

    outcomes = real_models_groups.run_matrix(selected, progress)
    seconds = time.monotonic() - start
    print(real_models.format_table(outcomes))
    failures = _failures(outcomes)
    if failures:
        print("\nruns that did not pass (whole reason, plan):\n" + failures)
    missed = real_models.missed_targets(outcomes)
    print(f"\n{len(outcomes)} runs in {seconds:.0f} s")
    print("targets met" if not missed else "targets missed:\n  " + "\n  ".join(missed))
    os.makedirs("bench/results", exist_ok=True)
    name = "real_models_replay.json" if args.only else "real_models.json"
    with open(os.path.join("bench/results", name), "w") as f:
        json.dump({"seconds": seconds, "missed_targets": missed,
                   "targets": {target: [o.case.key for o in bad] for target, bad
                               in real_models.target_failures(outcomes).items()},
                   "runs": [o.to_dict() for o in outcomes]}, f, indent=2)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
