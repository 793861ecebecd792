"""`planner profile MODEL`: time each unique layer for real on this machine's device."""

from __future__ import annotations

import json

from cost_models.layer_profile import DEFAULT_REPEATS, DEFAULT_WARMUP, profile_layers
from ir.output_file import write_text_atomic
from ir.errors import PlannerError
from planner.arg_types import check_out, count, device, n_samples, n_tokens
from planner.fmt import Progress, human_bytes, table
from planner.models import load_model, parse_dtype


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure per-layer time and memory on a real device",
                       description="Run each unique layer of MODEL forward and backward on "
                                   "the device (warm-up, then the median of repeats) and "
                                   "record seconds and saved-activation bytes.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--device", default="cpu", type=device, help="cpu or cuda[:N] (cpu)")
    p.add_argument("--micro-batch", type=n_samples, default=1)
    p.add_argument("--seq-len", type=n_tokens, default=None)
    p.add_argument("--dtype", default="fp32", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--warmup", type=count(0, 10**6, 3), default=DEFAULT_WARMUP)
    p.add_argument("--repeats", type=count(1, 10**6, 10), default=DEFAULT_REPEATS)
    p.add_argument("--out", default=None, help="write the profile JSON here")
    p.add_argument("--json", action="store_true", help="print the profile JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    check_out(args.out)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise PlannerError(f"--device {args.device}: no CUDA device is visible here (torch "
                           f"{torch.__version__}); use --device cpu")
    loaded = load_model(args.model, args.micro_batch, args.seq_len, device="meta")
    progress = Progress("profiling")
    doc = profile_layers(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                         name=loaded.name, device=args.device, dtype=parse_dtype(args.dtype),
                         warmup=args.warmup, repeats=args.repeats, progress=progress)
    progress.close()
    if args.out:  # atomic, keeping an old file's mode
        write_text_atomic(args.out, json.dumps(doc, indent=2) + "\n", "profile")
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    rows = [[l["name"], l["structural_hash"], f"{l['forward_seconds'] * 1e3:.3f}",
             f"{l['backward_seconds'] * 1e3:.3f}", human_bytes(l["saved_activation_bytes"])]
            for l in doc["layers"]]
    print(table(["layer", "hash", "fwd ms", "bwd ms", "saved"], rows))
    print(f"\n{doc['model']} on {doc['device']} ({doc['device_name']}), {doc['dtype']}, "
          f"micro-batch {doc['micro_batch']}" + (f" -> {args.out}" if args.out else ""))
    return 0
