"""Gradient accumulation's cost in a step's backward (issue 17): a zoo model's backward of
micro-batch 1 (every .grad None: AccumulateGrad steals the tensor) against its later
micro-batches (each AccumulateGrad adds into the existing .grad), one process, one
thread, thread clock. Per round, interleaved: a step of m micro-batches as the plain loop
runs it ("accum"), and the same with the gradients set to None before every backward
("steal"); accum - steal over micro-batches 2..m is the accumulation's cost. Beside it,
what the estimate adds per later micro-batch (`step_host.grad_accumulation_s` x m / (m-1),
/ the core share: one process) on a measured spec (`--cluster`) with the probe's figure measured here
(`step_loop_probes.grad_accumulate_host_s`, median of 5).

Read here (gradaccum, 2026-11-25 14:27-14:36 UTC, load 0.5-2.3, 150 rounds; median
[quartiles] per later micro-batch): gpt-tiny (68 tensors, 841 kB) 92-101 us [40, 165] at
m = 2/4/8, 1.4-1.5 us a tensor; mlp-small (10 tensors) 3-10 us, 0.3-1.0 us a tensor;
cnn-small (17) within noise (-26..16 us). The probe read 0.41-0.84 us a tensor (host);
on a profile-cluster spec (no add points: the kernel at its 13 GB/s copy rate) the
estimate would add 230 us for gpt-tiny, 2.3x the live figure: the kernel is priced only
where the kit measured adds (`step_host`, 4). A one-thread in-place add here: 0.8 us a
call, its kernel at 140-190 GB/s up to 256 KiB, 68 GB/s at 1 MiB, 38 GB/s at 4 MiB.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_grad_accum.py [--models mlp-small,gpt-tiny]
        [--rounds 30] --cluster spec.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from cost_models.clusters import get_cluster  # noqa: E402
from cost_models.step_host import grad_accumulation_s  # noqa: E402
from cost_models.step_loop_probes import grad_accumulate_host_s  # noqa: E402
from planner.models import load_layer_graph  # noqa: E402
from planner.zoo import FAMILIES, preset_config  # noqa: E402

GLOBAL_BATCH = 8  # bench_validate's


def step(model, family, batches, steal: bool) -> list[float]:
    """Per micro-batch backward thread seconds of one step."""
    model.zero_grad(set_to_none=True)
    out = []
    for kwargs, target in batches:
        loss = family.loss_fn(model(**kwargs), target)
        if steal:
            model.zero_grad(set_to_none=True)
        start = time.thread_time()
        loss.backward()
        out.append(time.thread_time() - start)
    return out


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp-small,cnn-small,gpt-tiny")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--cluster", required=True, help="a profile-cluster spec.json")
    args = parser.parse_args()
    probe_s = statistics.median(grad_accumulate_host_s() for _ in range(5))
    cluster = get_cluster(args.cluster)
    cal = dataclasses.replace(cluster.kernel_calibration, grad_accumulate_host_s=probe_s)
    cluster = dataclasses.replace(cluster, kernel_calibration=cal)
    print(f"probe: {probe_s * 1e6:.2f} us per tensor; host share {cluster.host_share}")
    for name in args.models.split(","):
        fam_name, config = preset_config(name)
        family = FAMILIES[fam_name]
        torch.manual_seed(0)
        model = family.build(config)
        params = list(model.parameters())
        nbytes = sum(p.numel() * p.element_size() for p in params)
        layers = load_layer_graph(name, micro_batch=1, dtype=torch.float32).layers
        for m in (2, 4, 8):
            batches = [family.example_inputs(config, GLOBAL_BATCH // m) for _ in range(m)]
            times = {False: [], True: []}
            for rnd in range(args.rounds + 3):
                for steal in ((False, True) if rnd % 2 else (True, False)):
                    t = step(model, family, batches, steal)
                    if rnd >= 3:
                        times[steal].append(t)
            first = {s: statistics.median(t[0] for t in times[s]) for s in times}
            later = {s: statistics.median(statistics.fmean(t[1:]) for t in times[s])
                     for s in times}
            diffs = sorted(statistics.fmean(a[1:]) - statistics.fmean(b[1:])
                           for a, b in zip(times[False], times[True]))
            q = len(diffs) // 4
            print(f"{name} m={m} ({len(params)} tensors, {nbytes / 1e3:.0f} kB): backward mb1 "
                  f"accum {first[False] * 1e6:.0f} us, later accum {later[False] * 1e6:.0f} us"
                  f" steal {later[True] * 1e6:.0f} us; accum-steal per later mb "
                  f"{statistics.median(diffs) * 1e6:.1f} us [{diffs[q] * 1e6:.1f}, "
                  f"{diffs[-q - 1] * 1e6:.1f}] = "
                  f"{statistics.median(diffs) / len(params) * 1e6:.2f} us/tensor; estimate "
                  f"{grad_accumulation_s(cluster, layers, m) * m / (m - 1) / cluster.host_share * 1e6:.1f}"
                  " us",
                  flush=True)


if __name__ == "__main__":
    main()
