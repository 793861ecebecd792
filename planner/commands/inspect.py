"""`planner inspect MODEL`: the layer IR as a table (or JSON), traced on the meta device."""

from __future__ import annotations

import json

from planner.arg_types import n_samples, n_tokens
from planner.fmt import Progress, human_bytes, human_count, table
from planner.models import load_layer_graph, parse_dtype


def register(sub) -> None:
    p = sub.add_parser("inspect", help="trace a model and show its layers",
                       description="Trace MODEL on the meta device and print per-layer "
                                   "parameters, FLOPs and activation memory.")
    p.add_argument("model", metavar="MODEL",
                   help="preset (gpt3-175b), family:overrides (gpt:layers=4,hidden=256), "
                        "package.module:factory, or hf:config.json")
    p.add_argument("--micro-batch", type=n_samples, default=1, help="samples per micro-batch (1)")
    p.add_argument("--seq-len", type=n_tokens, default=None, help="sequence length (model default)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"],
                   help="activation dtype the bytes are measured in (bf16)")
    p.add_argument("--trace", choices=["fx", "export"], default=None,
                   help="force a tracing method (default: fx, falling back to export)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def graph_to_json(graph) -> dict:
    return {
        "model": graph.model,
        "trace_method": graph.trace_method,
        "num_params": graph.num_params,
        "dtype": graph.dtype,
        "micro_batch": graph.micro_batch,
        "seq_len": graph.seq_len,
        "fingerprint": graph.fingerprint,
        "unique_layers_measured": graph.unique_layers_measured,
        "cut_points": list(graph.cut_points),
        "layers": [{
            "name": l.name, "kind": l.kind, "params": l.params, "param_bytes": l.param_bytes,
            "flops_fwd": l.flops_fwd, "flops_bwd": l.flops_bwd,
            "saved_activation_bytes": l.saved_activation_bytes,
            "saved_tp_sharded_bytes": l.saved_tp_sharded_bytes,
            "saved_attention_bytes": l.saved_attention_bytes,
            "saved_dropout_mask_bytes": l.saved_dropout_mask_bytes,
            "input_bytes": l.input_bytes, "output_bytes": l.output_bytes,
            "tp_params": l.tp_params, "structural_hash": l.structural_hash,
            "tp_candidates": [str(c) for c in l.tp_candidates],
            "tp_divisors": dict(l.tp_divisors),
        } for l in graph.layers],
    }


def _grouped_rows(graph) -> list[list[object]]:
    """Consecutive layers with the same structure and figures share one row."""
    rows, i, layers = [], 0, graph.layers
    while i < len(layers):
        j = i
        key = lambda l: (l.structural_hash, l.params, l.kind)  # noqa: E731
        while j + 1 < len(layers) and key(layers[j + 1]) == key(layers[i]):
            j += 1
        l, count = layers[i], j - i + 1
        name = l.name if count == 1 else f"{l.name} .. {layers[j].name}"
        tp = ",".join(sorted({str(c.style) for c in l.tp_candidates})) or "-"
        rows.append([name, l.kind, f"x{count}" if count > 1 else "", human_count(l.params),
                     human_count(l.flops_fwd), human_count(l.flops_bwd),
                     human_bytes(l.saved_activation_bytes), human_bytes(l.output_bytes), tp])
        i = j + 1
    return rows


def run(args) -> int:
    progress = Progress("measuring")
    graph = load_layer_graph(args.model, args.micro_batch, args.seq_len, parse_dtype(args.dtype),
                             force_trace=args.trace, progress=progress)
    progress.close()
    if args.json:
        print(json.dumps(graph_to_json(graph), indent=2))
        return 0
    headers = ["layer", "kind", "count", "params", "fwd FLOPs", "bwd FLOPs", "saved",
               "output", "TP"]
    print(table(headers, _grouped_rows(graph), right={2, 3, 4, 5, 6, 7}))
    saved = sum(l.saved_activation_bytes for l in graph.layers)
    print(f"\n{graph.model}: {graph.num_params:,} parameters ({human_count(graph.num_params)}), "
          f"{len(graph.layers)} layers ({graph.unique_layers_measured} measured), traced with "
          f"{graph.trace_method}")
    print(f"per micro-batch of {graph.micro_batch}"
          + (f" x {graph.seq_len} tokens" if graph.seq_len else "")
          + f" in {graph.dtype}: {human_count(graph.flops_fwd)} FLOPs forward, "
          f"{human_count(graph.flops_bwd)} backward, {human_bytes(saved)} saved for backward")
    print(f"pipeline cut points after layers: {_ranges(graph.cut_points)}")
    return 0


def _ranges(xs) -> str:
    if not xs:
        return "none"
    parts, start = [], xs[0]
    for a, b in zip(xs, list(xs[1:]) + [None]):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(parts)
