"""A one-process smoke of every executor feature a world of 1 runs (issue 17).

For tiny zoo models and one Hugging Face config, each case plans with pins (`planner
plan`, in this process; cluster h100-80g on a GPU, local otherwise), builds the plan with
the executor as `planner validate`'s ranks do (`planner.trial.rank`), runs STEPS steps
and checks the losses are finite and, where cheap, match the one-process reference
(`planner.trial.reference`). One rank: NCCL on a GPU, gloo on a CPU (so it runs here).

    python bench/bench_gpu_smoke.py [--only NAME,NAME] [--out smoke.json]

Prints one line per case (PASS/FAIL, seconds, the exception's first line and the frame
in this repository it came from) and a summary; writes the rows to --out; exits 1 when
a case failed. Needs no network (HF models from tests/data/hf configs, random init).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

STEPS = 3  # steps per case: the first allocates optimizer states, two more run warm
GLOBAL_BATCH = 2  # rows per step; micro-batch 1 makes it 2 accumulated micro-batches
PG_TIMEOUT_S = 60  # a collective here takes ms; a hung one fails inside the < 60 s budget
HF_LLAMA = "hf:" + os.path.join(ROOT, "tests", "data", "hf", "llama", "config.json")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: str
    pins: tuple[str, ...] = ()  # `planner plan` flags
    # A layer at dp 1 is an FSDP2 unit only in mixed precision (`ir.strategy.
    # runs_as_dp_unit`): the ZeRO cases run bf16 or fp16.
    # Set after the search (which offers only plain replication at dp 1, and refuses
    # fp16 on a cluster spec without an fp16 peak): every layer's ZeRO stage, the
    # precision, the first ZeRO-3 layer offloaded (FSDP2's CPUOffloadPolicy).
    zero: int | None = None
    precision: str | None = None
    offload_layer: bool = False
    compare: bool = True  # losses against the one-process reference
    resume: bool = False  # save after step 2 through DCP, resume in a fresh build, step 3
    meta_init: bool = False  # `planner plan --meta-init`: built on meta, shards materialized
    api: bool = False  # `planner.auto_parallel` on a meta-built model: it searches itself


def cases() -> list[Case]:
    fp32 = ("--precision", "fp32", "--checkpoint", "none")
    bf16 = ("--precision", "bf16-mixed", "--checkpoint", "none")
    out = [Case(f"{m}-fp32", m, fp32)
           for m in ("gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny", "mlp-small",
                     "cnn-small")]
    out += [
        Case("gpt-tiny-bf16", "gpt-tiny", bf16),
        Case("gpt-tiny-fp16", "gpt-tiny", bf16, precision="fp16-mixed"),
        Case("gpt-tiny-zero1-bf16", "gpt-tiny", bf16, zero=1),
        Case("gpt-tiny-zero2-bf16", "gpt-tiny", bf16, zero=2),
        Case("gpt-tiny-zero3-bf16", "gpt-tiny", bf16, zero=3),
        Case("llama-tiny-zero3-bf16", "llama-tiny", bf16, zero=3),
        Case("t5-tiny-zero2-fp16", "t5-tiny", bf16, zero=2, precision="fp16-mixed"),
        Case("gpt-tiny-selective", "gpt-tiny", ("--precision", "fp32", "--checkpoint",
                                                "selective")),
        Case("gpt-tiny-full", "gpt-tiny", ("--precision", "fp32", "--checkpoint", "full")),
        Case("llama-tiny-full-zero3-bf16", "llama-tiny",
             ("--precision", "bf16-mixed", "--checkpoint", "full"), zero=3),
        Case("gpt-tiny-accum2", "gpt-tiny", fp32 + ("--micro-batch", "1")),
        Case("gpt-tiny-accum2-zero3-bf16", "gpt-tiny", bf16 + ("--micro-batch", "1"), zero=3),
        Case("gpt-tiny-meta-init", "gpt-tiny", fp32, meta_init=True),
        Case("llama-tiny-meta-init-zero3", "llama-tiny", bf16, zero=3, meta_init=True),
        Case("gpt-tiny-offload", "gpt-tiny", bf16, zero=3, offload_layer=True),
        Case("gpt-tiny-resume", "gpt-tiny", fp32, resume=True),
        Case("gpt-tiny-zero1-bf16-resume", "gpt-tiny", bf16, zero=1, resume=True),
        Case("gpt-tiny-zero3-bf16-resume", "gpt-tiny", bf16, zero=3, resume=True),
        Case("dlrm-small-tables", "dlrm-small", ("--precision", "fp32")),
        Case("dlrm-small-tables-resume", "dlrm-small", ("--precision", "fp32"), resume=True),
        Case("gpt-tiny-auto-parallel", "gpt-tiny", api=True),
        Case("hf-llama-fp32", HF_LLAMA, fp32),
        Case("hf-llama-zero3-bf16-sel", HF_LLAMA,
             ("--precision", "bf16-mixed", "--checkpoint", "selective"), zero=3),
    ]
    return out


def plan_case(case: Case, cluster: str, work: str):
    """The case's plan document (`planner plan` with its pins, in this process)."""
    from ir.errors import PlannerError
    from ir.plan import load_plan
    from planner.cli import main as planner

    path = os.path.join(work, "plan.json")
    argv = ["plan", case.model, "--cluster", cluster, "--nodes", "1", "--gpus-per-node", "1",
            "--global-batch", str(GLOBAL_BATCH), "--no-baselines", "--out", path, *case.pins]
    if not case.model.startswith("dlrm"):  # a hybrid plan pins its tables' own way
        argv += ["--dp", "1", "--tp", "1", "--pp", "1", "--no-offload"]
        if "--micro-batch" not in case.pins:
            argv += ["--micro-batch", str(GLOBAL_BATCH)]
    if case.meta_init:
        argv.append("--meta-init")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = planner(argv)
    if status:
        raise PlannerError(f"{err.getvalue().strip()[:400]} (`planner {' '.join(argv)}`: "
                           f"exit {status})")
    return _rewritten(load_plan(path), case)


def _rewritten(doc, case: Case):
    """The plan with the case's ZeRO stage, precision and offloaded layer."""
    from ir.strategy import DPMode, Precision

    layers = list(doc.plan.layer_strategies)
    if case.zero is not None:
        layers = [dataclasses.replace(s, dp_mode=DPMode.from_stage(case.zero)) for s in layers]
    if case.offload_layer:
        k = next(i for i, s in enumerate(layers) if s.dp_mode is DPMode.ZERO3)
        layers[k] = dataclasses.replace(layers[k], offload=True)
    plan = dataclasses.replace(doc.plan, layer_strategies=tuple(layers))
    if case.precision is not None:
        plan = dataclasses.replace(plan, precision=Precision(case.precision))
    return dataclasses.replace(doc, plan=plan)


def run_case(case: Case, cluster: str, device: str) -> dict:
    from ir.plan import plan_to_json
    from planner.models import graph_for_plan
    from planner.trial.rank import _build
    from planner.trial.records import RankPayload
    from planner.trial.reference import (global_batches, loss_rtol, losses_match,
                                         reference_run)

    if case.api:
        return _api_case(case, cluster, device)
    row: dict = {}
    with tempfile.TemporaryDirectory() as work:
        doc = plan_case(case, cluster, work)
        row["plan"] = str(doc.plan)
        graph = graph_for_plan(doc, case.model)
        batches = global_batches(case.model, doc.plan.global_batch, doc.seq_len, STEPS)
        payload = RankPayload(plan_json=plan_to_json(doc), plan_path=case.name,
                              model=case.model, seq_len=doc.seq_len, graph=graph,
                              batches=batches, memory_steps=0, steps=STEPS, backend="",
                              check_steps=0, threads=0)
        import torch
        pm = _build(payload, torch.device(device), without_dropout=True)
        _check_built(case, doc, pm)
        losses = [pm.train_step(*batches[k]) for k in range(STEPS)]
        row["losses"] = losses
        if not all(math.isfinite(x) for x in losses):
            raise AssertionError(f"a loss is not finite: {losses}")
        if case.resume:
            from executors.checkpoint import load_checkpoint, save_checkpoint
            pm = _build(payload, torch.device(device), without_dropout=True)
            for k in range(STEPS - 1):
                pm.train_step(*batches[k])
            saved = save_checkpoint(pm, os.path.join(work, "ckpt"))
            del pm
            fresh = _build(payload, torch.device(device), without_dropout=True)
            step = load_checkpoint(fresh, saved)
            resumed = fresh.train_step(*batches[step])
            row["resumed_loss"] = resumed
            # a 16-bit loss moves in steps of its rounding (CUDA's atomics may flip one)
            if step != STEPS - 1 or not losses_match([resumed], [losses[-1]],
                                                     loss_rtol(doc.plan.precision)):
                raise AssertionError(f"resumed at step {step}: loss {resumed!r}, the "
                                     f"uninterrupted run's {losses[-1]!r}")
        if case.compare:
            ref = reference_run(case.model, doc.seq_len, doc.plan.optimizer, batches, STEPS,
                                doc.plan.embeddings, device=device,
                                optimizer_impl=doc.plan.optimizer_impl).losses
            row["reference"] = ref
            rtol = loss_rtol(doc.plan.precision)
            if not losses_match(losses, ref, rtol):
                raise AssertionError(f"losses {losses} vs reference {ref} (rtol {rtol})")
    return row


def _api_case(case: Case, cluster: str, device: str) -> dict:
    """The documented user path: build on meta, `auto_parallel` plans (fp32: the reference
    tolerance is exact) and shards it, STEPS steps against the one-process reference."""
    from executors import meta_init
    from planner import auto_parallel
    from planner.models import example_batch, load_model
    from planner.trial.reference import (SEED, global_batches, losses_match, optimizer_kwargs,
                                         reference_run, zero_dropout)

    inputs, target = example_batch(case.model, 1, None, seed=SEED)
    with meta_init():
        loaded = load_model(case.model, micro_batch=1, device="meta", seed=SEED)
    zero_dropout(loaded.module)
    ap = auto_parallel(loaded.module, (inputs, target), loss_fn=loaded.loss_fn,
                       cluster=cluster, global_batch=GLOBAL_BATCH, precision="fp32",
                       optimizer_kwargs=optimizer_kwargs("adamw"))
    batches = global_batches(case.model, GLOBAL_BATCH, None, STEPS)
    losses = [ap.train_step(batches[k]) for k in range(STEPS)]
    ref = reference_run(case.model, None, ap.plan.optimizer, batches, STEPS,
                        device=device, optimizer_impl=ap.plan.optimizer_impl).losses
    if not losses_match(losses, ref):
        raise AssertionError(f"losses {losses} vs reference {ref}")
    return {"plan": str(ap.plan), "losses": losses, "reference": ref}


def _check_built(case: Case, doc, pm) -> None:
    """The features the case names were really applied (not silently dropped)."""
    from torch.distributed.fsdp import FSDPModule

    from executors.data_parallel import offloaded_params
    from planner.models import planned_on_meta

    if case.meta_init and not planned_on_meta(doc):
        raise AssertionError("the plan does not record --meta-init: built on the CPU")
    units = [m for _, m in pm.stage_modules for m in m.modules() if isinstance(m, FSDPModule)]
    if case.zero is not None and not units:
        raise AssertionError(f"ZeRO-{case.zero} asked, but no layer is an FSDP2 unit")
    offloaded = offloaded_params([m for _, m in pm.stage_modules])
    if case.offload_layer != bool(offloaded):
        raise AssertionError(f"{len(offloaded)} offloaded parameters; the case "
                             f"{'offloads' if case.offload_layer else 'does not offload'}")


def where(exc: BaseException) -> str:
    """The innermost frame of the traceback in this repository, the smoke's own only when
    no other is there (its checks raise there)."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__)
            if f.filename.startswith(ROOT) and "/.venv/" not in f.filename]
    if not ours:
        return "-"
    f = ([g for g in ours if not g.filename.endswith("bench_gpu_smoke.py")] or ours)[-1]
    return f"{os.path.relpath(f.filename, ROOT)}:{f.lineno} in {f.name}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--cluster", default=None, help="default: h100-80g on a GPU, else local")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gpu_smoke.json"))
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    cluster = args.cluster or ("h100-80g" if cuda else "local")
    device = "cuda" if cuda else "cpu"
    from executors import init_distributed

    if cuda:
        torch.cuda.set_device(0)
    # one rank (NCCL on a GPU, gloo here); a hung collective fails the run, not the lease
    init_distributed(timeout_s=PG_TIMEOUT_S)
    chosen = cases()
    if args.only:
        names = set(args.only.split(","))
        chosen = [c for c in chosen if c.name in names]
    rows = []
    start_all = time.perf_counter()
    try:
        for case in chosen:
            start = time.perf_counter()
            row = {"case": case.name, "model": case.model}
            try:
                row.update(run_case(case, cluster, device))
                row["status"] = "PASS"
            except Exception as exc:  # noqa: BLE001 -- every failure is a row
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                row.update(status="FAIL", error=f"{type(exc).__name__}: {first}",
                           frame=where(exc), traceback=traceback.format_exc()[-4000:])
            row["seconds"] = round(time.perf_counter() - start, 2)
            rows.append(row)
            detail = (f"{row['error']} [{row['frame']}]" if row["status"] == "FAIL"
                      else row.get("plan", ""))
            print(f"{row['status']} {case.name:26s} {row['seconds']:6.1f}s  {detail}",
                  flush=True)
            _write(args.out, rows, cluster, time.perf_counter() - start_all)  # so far
            if cuda:
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    failed = [r["case"] for r in rows if r["status"] != "PASS"]
    total_s = time.perf_counter() - start_all
    _write(args.out, rows, cluster, total_s)
    print(f"{len(rows) - len(failed)}/{len(rows)} passed in {total_s:.1f} s on "
          f"{torch.cuda.get_device_name() if cuda else 'cpu'} (torch {torch.__version__})"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def _write(path: str, rows: list, cluster: str, seconds: float) -> None:
    """The rows as JSON, rewritten after every case (a run cut short keeps its rows)."""
    import torch

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name() if torch.cuda.is_available()
                   else "cpu", "torch": torch.__version__, "cluster": cluster,
                   "seconds": round(seconds, 1), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
