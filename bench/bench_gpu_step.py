"""Where one executed training step's time goes on a GPU: host vs device (issue 17).

Plans MODEL on the h100-80g preset (dp/tp/pp 1, the given checkpointing, micro-batch and
precision), builds it with the executor on this process's device (one NCCL rank; gloo on
a CPU, so the script is checked here too), times warm steps, then runs two under
torch.profiler: the device's kernel time against the step's wall time says whether the
step is host-bound, and the top ops by host and by device time say where.

    python bench/bench_gpu_step.py --cases llama3.2-1b:none:1,gpt3-1.3b:full:4
        [--precision bf16-mixed] [--seq-len 1024] [--out DIR]

Each case (MODEL:CHECKPOINT:MICRO_BATCH) runs in this one process, one after another.
Prints the tables; writes DIR/gpu_step.json (per case: wall, predicted time and its parts,
peak memory after the first step against the prediction, device busy, op counts, top
ops; rows `bench_gpu_validate.py --reprice` reads). A diagnostic: no target, exit 0 when it ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WARM_STEPS = 3
TIMED_STEPS = int(os.environ.get("GPU_STEP_TIMED", "5"))  # host-bound steps jitter: raise it there
PROFILED_STEPS = 2
TOP_OPS = 15


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="llama3.2-1b:none:1")
    ap.add_argument("--precision", default="bf16-mixed")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--cluster", default="h100-80g")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    reports = []
    try:
        for case in args.cases.split(","):
            model, checkpoint, micro_batch = case.split(":")
            with tempfile.TemporaryDirectory() as work:
                plan = os.path.join(work, "plan.json")
                subprocess.run([sys.executable, "-m", "planner.cli", "plan", model, "--cluster",
                                args.cluster, "--nodes", "1", "--gpus-per-node", "1",
                                "--global-batch", micro_batch, "--micro-batch", micro_batch,
                                "--seq-len", str(args.seq_len), "--dp", "1", "--tp", "1",
                                "--pp", "1", "--checkpoint", checkpoint, "--precision",
                                args.precision, "--no-offload", "--out", plan], cwd=ROOT,
                               check=True, capture_output=True)
                reports.append(profile_step(plan, model, args, cuda))
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "gpu_step.json"), "w") as fh:
                json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu",
                           "torch": torch.__version__, "rows": reports}, fh, indent=1)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    return 0


def profile_step(plan_path: str, model: str, args, cuda: bool) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from executors import apply, default_device
    from ir.plan import load_plan
    from planner.models import load_model
    from planner.trial.predict import plan_graph, predict
    from planner.trial.reference import SEED, global_batches, optimizer_kwargs

    doc = load_plan(plan_path)
    graph = plan_graph(doc, plan_path)
    predicted = predict(doc, graph, None)
    device = default_device()
    loaded = load_model(model, micro_batch=1, seq_len=doc.seq_len, device="cpu", seed=SEED)
    pm = apply(loaded.module, doc.plan, graph, loss_fn=loaded.loss_fn, device=device,
               optimizer_kwargs=optimizer_kwargs(doc.plan.optimizer),
               example_inputs=loaded.inputs)
    batches = global_batches(model, doc.plan.global_batch, doc.seq_len, 2)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    pm.train_step(*batches[0])
    sync()
    if cuda:  # as validate measures: the steps after the first
        torch.cuda.reset_peak_memory_stats()
    for k in range(1, WARM_STEPS):
        pm.train_step(*batches[k % 2])
    sync()
    peak_bytes = torch.cuda.max_memory_allocated() if cuda else 0
    walls = []
    for k in range(TIMED_STEPS):
        start = time.perf_counter()
        pm.train_step(*batches[k % 2])
        sync()
        walls.append(time.perf_counter() - start)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for k in range(PROFILED_STEPS):
            pm.train_step(*batches[k % 2])
        sync()
    averages = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in averages) / PROFILED_STEPS if cuda else 0.0
    aten_calls = sum(e.count for e in averages if e.key.startswith("aten::")) / PROFILED_STEPS
    kernels = sum(e.count for e in averages if e.self_device_time_total > 0
                  and not e.key.startswith(("aten::", "Memcpy", "Memset"))) / PROFILED_STEPS \
        if cuda else 0
    wall = statistics.median(walls)
    step_rows = [e for e in averages if e.key.startswith("Optimizer.step#")]
    optimizer_host_s = sum(e.cpu_time_total for e in step_rows) / 1e6 / PROFILED_STEPS
    tensors = sum(1 for p in loaded.module.parameters() if p.requires_grad)
    top_cpu = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:TOP_OPS]
    top_dev = sorted(averages, key=lambda e: -e.self_device_time_total)[:TOP_OPS] if cuda else []
    predicted_peak = predicted.peak_bytes_by_rank[0]
    case = f"{model} ckpt {doc.plan.layer_strategies[1].checkpoint.value} mb {doc.plan.micro_batch}"
    print(f"{case} {args.precision}: peak {peak_bytes / 2**30:.2f} GiB, predicted "
          f"{predicted_peak / 2**30:.2f} ({(predicted_peak - peak_bytes) / max(peak_bytes, 1):+.1%});"
          f" wall "
          f"{wall * 1e3:.1f} ms (steps {', '.join(f'{w * 1e3:.1f}' for w in walls)}), "
          f"predicted {predicted.iteration_seconds * 1e3:.1f} ms "
          f"({(predicted.iteration_seconds - wall) / wall:+.1%}) "
          f"{ {k: round(v * 1e3, 2) for k, v in predicted.time_breakdown.items()} }")
    print(f"  optimizer step: host {optimizer_host_s * 1e3:.2f} ms for {tensors} tensors "
          f"({optimizer_host_s / max(tensors, 1) * 1e6:.2f} us per tensor)")
    print(f"  device kernel time {device_us / 1e3:.1f} ms per step ({device_us / 1e4 / wall:.0f}% "
          f"of wall), {aten_calls:.0f} aten calls, {kernels:.0f} kernels per step")
    print("  top self host time (ms per step, calls): " + "; ".join(
        f"{e.key} {e.self_cpu_time_total / 1e3 / PROFILED_STEPS:.2f} ({e.count // PROFILED_STEPS})"
        for e in top_cpu))
    if cuda:
        print("  top self device time (ms per step, calls): " + "; ".join(
            f"{e.key[:60]} {e.self_device_time_total / 1e3 / PROFILED_STEPS:.2f} "
            f"({e.count // PROFILED_STEPS})" for e in top_dev))
    # the keys of bench_gpu_validate.py's rows, so `bench_gpu_validate.py --reprice` reads
    # these too (no losses checked here: None)
    return {"model": model, "checkpoint": doc.plan.layer_strategies[1].checkpoint.value,
            "micro_batch": doc.plan.micro_batch, "seq_len": args.seq_len,
            "precision": args.precision, "measured_s": wall, "step_seconds": walls,
            "measured_peak_bytes": peak_bytes, "predicted_peak_bytes": predicted_peak,
            "losses_match": None, "grads_match": None,
            "parameters": sum(p.numel() for p in loaded.module.parameters()),
            "predicted_s": predicted.iteration_seconds,
            "predicted_time": predicted.time_breakdown, "device_busy_s": device_us / 1e6,
            "aten_calls": aten_calls, "kernels": kernels, "optimizer_host_s": optimizer_host_s,
            "param_tensors": tensors,
            "top_host": [(e.key, e.self_cpu_time_total / 1e6 / PROFILED_STEPS,
                          e.count // PROFILED_STEPS) for e in top_cpu],
            "top_device": [(e.key, e.self_device_time_total / 1e6 / PROFILED_STEPS,
                            e.count // PROFILED_STEPS) for e in top_dev]}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
