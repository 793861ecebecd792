"""How much `planner profile`'s per-layer figures move when each layer is timed after its
step neighbours' work (`cost_models.layer_profile.StepNeighbours`) instead of right
after its own backward; one thread, the thread clock.

For each zoo model and micro-batch: trace it (meta, fp32) and run
`layer_profile.profile_graph` four times, alternating the neighbours' work off and on
(off: `StepNeighbours` runs nothing, as `time_layer` ran before); each layer's figure
is the lower of its two runs. Prints forward and backward, off -> on, per unique layer,
and writes bench/results/profile_neighbours.json. No target: a record of the change.

On 2026-11-25 (load 8-10 on 2 shared cores; micro-batches 1 and 16): a stack's blocks
(timed after a block now) moved -17 to -56 us at micro-batch 1 (-4 to -13%), -250 to
+47 us at 16; the small layers timed after a different one rose: embeddings +1 to +48 us
forward and +1 to +40 backward at 1 (llama's 8.8 -> 27.9 us, gpt's 38 -> 87), final
norms +5 to +10 forward, +9 to +12 backward; t5's relative biases +39 to +133 forward.
A second run (gpt-tiny, llama-tiny, micro-batch 1, load ~5): blocks -32 and -41 us
forward, -21 and -28 backward; embeddings +17 and +10 forward, +15 and +19 backward;
norms +4 and +6 forward, +6 and +15 backward; heads within 1 us forward. Re-measure on a
quiet machine.

    .venv/bin/python bench/bench_profile_neighbours.py [--models gpt-tiny] [--batches 1,16]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_kernel_model import traced_graph  # noqa: E402
from cost_models import layer_profile  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from planner.fmt import table  # noqa: E402

MODELS = ("t5-tiny", "dlrm-small", "gpt-tiny", "llama-tiny", "bert-tiny", "mlp-small")
WARMUP, REPEATS = 3, 9
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "profile_neighbours.json")


def profiles(graph, measurer) -> dict[str, dict[str, tuple[float, float]]]:
    """{"off"|"on": {layer name: (forward, backward) seconds}}, each the lower of two runs."""
    work = (layer_profile.StepNeighbours.before_forward,
            layer_profile.StepNeighbours.before_backward)
    out: dict[str, dict] = {"off": {}, "on": {}}
    try:
        for mode in ("off", "on", "off", "on"):
            on = mode == "on"
            layer_profile.StepNeighbours.before_forward = work[0] if on else (lambda self: None)
            layer_profile.StepNeighbours.before_backward = work[1] if on else (lambda self: [])
            for m in layer_profile.profile_graph(graph, measurer, "cpu", warmup=WARMUP,
                                                 repeats=REPEATS):
                seen = out[mode].get(m["name"], (float("inf"), float("inf")))
                out[mode][m["name"]] = (min(seen[0], m["forward_seconds"]),
                                        min(seen[1], m["backward_seconds"]))
    finally:
        (layer_profile.StepNeighbours.before_forward,
         layer_profile.StepNeighbours.before_backward) = work
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    parser.add_argument("--batches", default="1,16", help="comma-separated micro-batches")
    args = parser.parse_args()
    torch.set_num_threads(1)
    layer_profile.time = types.SimpleNamespace(perf_counter=probe_clock("cpu"))
    rows = []
    for model in args.models.split(","):
        for mb in (int(b) for b in args.batches.split(",")):
            graph, measurer = traced_graph(model, mb)
            timed = profiles(graph, measurer)
            for name, off in timed["off"].items():
                on = timed["on"][name]
                rows.append({"model": model, "micro_batch": mb, "layer": name,
                             "forward_off_s": off[0], "forward_on_s": on[0],
                             "backward_off_s": off[1], "backward_on_s": on[1]})
    print(table(["model", "mb", "layer", "fwd off us", "fwd on us", "bwd off us", "bwd on us"],
                [[r["model"], r["micro_batch"], r["layer"],
                  *(f"{r[k] * 1e6:.1f}" for k in ("forward_off_s", "forward_on_s",
                                                  "backward_off_s", "backward_on_s"))]
                 for r in rows]))
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"load_average": os.getloadavg(), "rows": rows}, f, indent=1)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
