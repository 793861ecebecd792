"""Predicted vs measured peak memory of real CPU training steps, zoo models x checkpointing.

For each model: trace the layer IR (meta, fp32) and predict the per-rank peak with
`cost_models.memory.plan_memory` on the `local` cluster (one process, fp32, AdamW, one
micro-batch), minus the fixed runtime overhead; then build the same model on the CPU
and run the same one-device plan with the executor (`planner.trial.rank.
measure_one_process`: executors.apply, then train_step: forward -> loss -> backward ->
tied-copy gradient sum -> AdamW step -> zero_grad(set_to_none)) under
`LiveTensorTracker`, which counts every tensor storage from birth to death. The peak is
taken after the first step (optimizer states exist). "full" checkpoints every block (the
executor's `apply_ac`: torch.utils.checkpoint, non-reentrant), as the plan marks them.

    .venv/bin/python bench/bench_memory.py [--micro-batch 8] [--models gpt-tiny,...]

Prints a table and writes bench/results/bench_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.clusters import get_cluster  # noqa: E402
from cost_models.memory import plan_memory  # noqa: E402
from ir.plan import ParallelPlan  # noqa: E402
from ir.strategy import Checkpoint, LayerStrategy, Precision, Stage  # noqa: E402
from planner.fmt import table  # noqa: E402
from planner.models import load_layer_graph  # noqa: E402
from planner.trial.rank import measure_one_process  # noqa: E402

MODELS = ("gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny", "mlp-small", "cnn-small",
          "dlrm-small")
TARGET = 0.05  # issue 3: prediction within 5% of the measurement
STEPS = 3  # one warm-up step (optimizer states appear) and two measured
BLOCK_NAME = re.compile(r"\.\d+$")  # a member of a block stack: blocks.3, encoder_blocks.0


def run_case(spec: str, micro_batch: int, checkpoint: bool) -> dict:
    graph = load_layer_graph(spec, micro_batch=micro_batch, dtype=torch.float32)
    blocks = [l.name for l in graph.layers if BLOCK_NAME.search(l.name)] if checkpoint else []
    strategies = tuple(LayerStrategy(checkpoint=Checkpoint.FULL if l.name in blocks
                                     else Checkpoint.NONE) for l in graph.layers)
    n = len(graph.layers)
    plan = ParallelPlan(stages=(Stage(0, n - 1, 1),), layer_strategies=strategies,
                        global_batch=micro_batch, micro_batch=micro_batch, num_microbatches=1,
                        precision=Precision.FP32, optimizer="adamw")
    stage = plan_memory(graph, plan, get_cluster("local")).stages[0]
    predicted = stage.peak_bytes - stage.overhead  # the tracker sees tensors, not the runtime

    start = time.perf_counter()
    mem = measure_one_process(spec, plan, graph, steps=STEPS, seed=0)
    seconds = time.perf_counter() - start
    measured = mem.peak_bytes
    measured_phase = max(mem.peak_by_phase, key=mem.peak_by_phase.get)
    return {"model": spec, "checkpoint": "full" if checkpoint else "none",
            "checkpointed_layers": len(blocks), "micro_batch": micro_batch,
            "measured_bytes": measured, "predicted_bytes": predicted,
            "error": (predicted - measured) / measured,
            "predicted_phase": stage.phase, "measured_phase": measured_phase,
            "predicted_breakdown": stage.breakdown(), "measured_by_phase": mem.peak_by_phase,
            "run_seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "bench_memory.json"))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows, results = [], []
    for spec in args.models.split(","):
        for checkpoint in (False, True):
            r = run_case(spec, args.micro_batch, checkpoint)
            results.append(r)
            rows.append([r["model"], r["checkpoint"], r["checkpointed_layers"],
                         f"{r['measured_bytes'] / 2**20:.3f}",
                         f"{r['predicted_bytes'] / 2**20:.3f}", f"{100 * r['error']:+.1f}%",
                         r["measured_phase"], r["predicted_phase"],
                         "yes" if abs(r["error"]) <= TARGET else "NO"])
    print(f"peak live tensor bytes, fp32 AdamW, micro-batch {args.micro_batch}, "
          f"real CPU steps vs prediction (target within {TARGET:.0%})")
    print(table(["model", "ckpt", "ckpt layers", "measured MiB", "predicted MiB", "error",
                 "measured at", "predicted at", "within"], rows, right={2, 3, 4, 5}))
    within = sum(abs(r["error"]) <= TARGET for r in results)
    print(f"{within} of {len(results)} cases within {TARGET:.0%}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"bench": "memory", "torch": torch.__version__, "host": platform.node(),
                   "machine": platform.machine(), "micro_batch": args.micro_batch,
                   "target": TARGET, "cases": results}, fh, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
