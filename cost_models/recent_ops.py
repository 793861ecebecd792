"""The recent ops a layer's passes keep as a pipeline rank runs them
(`Layer.recent_ops_fwd` / `_bwd`: per memory op, the bytes run since the work just before
ran it, `ir.op_count.recent_code_bytes`, priced by
`cold_kernel.recent_code_credit_seconds`). The trace counts them against the layer's
neighbours in the model; on a rank the work before a stage's first layer's forward and
after its last layer's backward is the rank's own (`placed_recent_ops`), and a window
that reaches past a cut is counted on the stage's layers alone (`stage_windows`): the
layers beyond run on another rank. `cost_models.step_host.place_rank` applies both, for
the estimate and the search (`planner.stage_host`) alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ir.layer import Layer
from ir.op_count import COLD_WINDOW_DISTINCT_OPS, recent_code_bytes

from cost_models.id_memo import IdMemo


def placed_recent_ops(layer: Layer, j: int, n: int, first: bool, last: bool,
                      after_own: bool) -> Layer:
    """Layer j of n (its windows clipped to its stage, `stage_windows`) with the recent
    ops (`Layer.recent_ops_fwd` / `_bwd`, `cold_kernel.recent_code_credit_seconds`) its
    placed passes keep: the trace's assume the layers before (forward) or its forward and
    the layers after (backward) just ran on this rank; a stage's first layer's forward
    follows another pass of the rank (none kept: no credit, as before the credit), and its
    last layer's backward keeps the trace's only where that is its own forward alone (the
    model's last layer, every backward right after its stage's forward: the plain loop,
    1F1B's last stage). A stage's first layer's backward follows the layer after's on its
    rank: the trace's, up to its stage's last layer."""
    keep_bwd = not last or (j == n - 1 and after_own)
    fields = {**({"recent_ops_fwd": ()} if first else {}),
              **({} if keep_bwd else {"recent_ops_bwd": ()})}
    return dataclasses.replace(layer, **fields) if fields else layer


def stage_windows(layers: Sequence[Layer], a: int, b: int) -> dict[int, dict]:
    """Layers of stage a..b whose trace-time recent ops (`ir.op_count.recent_code_bytes`
    over the model's neighbours) reach past the stage's cut and differ counted on the
    stage's layers alone: j -> those fields so counted (the layers beyond the cut run on
    another rank). A forward window reaches before a while the layers a..j-1 ran fewer
    than COLD_WINDOW_DISTINCT_OPS distinct ops (`recent_window_layers`: the layer before
    always, earlier ones while fewer ran), a backward window past b likewise; the first
    layer's forward and the last's backward keep none anyway (`placed_recent_ops`)."""
    reach: dict[int, list[str]] = {}
    for field, js, ops, beyond in (
            ("recent_ops_fwd", range(a, b + 1), "forward_overloads", a > 0),
            ("recent_ops_bwd", range(b, a - 1, -1), "backward_overloads", b < len(layers) - 1)):
        ran = getattr(layers[js[0]], ops)
        for j in js[1:] if beyond else ():
            if len(ran) >= COLD_WINDOW_DISTINCT_OPS:
                break
            reach.setdefault(j, []).append(field)
            ran = ran | getattr(layers[j], ops)
    out: dict[int, dict] = {}
    for j, fields in reach.items():
        changed = {f: c for f in fields if (c := _counted(layers, a, j, b, f))
                   != getattr(layers[j], f)}
        if changed:
            out[j] = changed
    return out


# Recent ops counted on a stage's layers, by the layers they read (the search places the
# same windows for many candidate stages).
_COUNTED = IdMemo(max_entries=4096)


def _counted(layers: Sequence[Layer], a: int, j: int, b: int, field: str) -> tuple:
    """Layer j's `field` counted on the stage's layers alone: a forward's on a..j (the
    layers before it), a backward's on j..b (its window after it)."""
    span = tuple(layers[a:j + 1] if field == "recent_ops_fwd" else layers[j:b + 1])
    index = len(span) - 1 if field == "recent_ops_fwd" else 0
    return _COUNTED.get((field, tuple(map(id, span))), span,
                        lambda: recent_code_bytes(list(span), index)[field])
