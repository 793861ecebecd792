"""A picture of a plan: one column per layer; rows for TP degree, ZeRO stage and
checkpointing; vertical lines at pipeline stage boundaries."""

from __future__ import annotations

import math
import os
import tempfile

from ir.errors import PlannerError
from ir.plan import PlanDocument
from ir.strategy import Checkpoint


def draw(doc: PlanDocument, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlannerError("--chart needs matplotlib: pip install 'planner[chart]'") from None
    plan = doc.plan
    n = len(plan.layer_strategies)
    tp = [math.log2(s.tp) for s in plan.layer_strategies]
    zero = [s.dp_mode.stage for s in plan.layer_strategies]
    height = {Checkpoint.FULL: 1.0, Checkpoint.SELECTIVE: 0.5, Checkpoint.NONE: 0.0}
    ckpt = [height[s.checkpoint] for s in plan.layer_strategies]
    fig, axes = plt.subplots(3, 1, figsize=(max(6, min(20, n / 6)), 4.5), sharex=True)
    for ax, values, label, top in ((axes[0], tp, "log2 TP", max(tp + [1])),
                                   (axes[1], zero, "ZeRO stage", 3),
                                   (axes[2], ckpt, "checkpoint", 1)):
        ax.bar(range(n), values, width=1.0, color="#1f77b4")
        ax.set_ylabel(label)
        ax.set_ylim(0, top * 1.1 if top else 1)
        for stage in plan.stages[1:]:
            ax.axvline(stage.first_layer - 0.5, color="#d62728", linewidth=1)
    axes[2].set_xlabel(f"layer (red lines: stage boundaries; {len(plan.stages)} stages)")
    fig.suptitle(f"{doc.model_name}: {plan}", fontsize=9)
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".chart-", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
