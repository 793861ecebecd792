"""Reports for people: the `planner estimate` and `planner memory` tables and the memory chart."""

from __future__ import annotations

from cost_models.compute_breakdown import ComputeByClass
from cost_models.estimate import Estimate
from cost_models.memory import MemoryEstimate
from ir.errors import PlannerError
from planner.fmt import human_bytes, table

GiB = 2**30
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "overhead")
# Stacked-bar colours, one per memory part (matplotlib's tab10 order).
PART_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#7f7f7f")


def gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f}"


def time_table(est: Estimate, by_class: ComputeByClass | None = None) -> str:
    """The iteration's time by part (the critical rank's); `by_class` splits compute by
    kernel class (`cost_models.compute_breakdown`)."""
    t = est.time
    total = est.iteration_seconds or 1.0

    def row(name: str, seconds: float) -> list[str]:
        return [name, f"{seconds:.4g}", f"{100 * seconds / total:.1f}%"]

    rows = [row("compute", t.compute)]
    if by_class is not None:
        rows += [row(f"  {name}", seconds) for name, seconds in by_class.rows() if seconds]
    rows += [row(name, seconds)
             for name, seconds in (("tp comm", t.tp_comm), ("dp comm", t.dp_comm),
                                   ("pp comm", t.pp_comm), ("bubble", t.bubble),
                                   ("optimizer", t.optimizer))]
    rows.append(["iteration", f"{est.iteration_seconds:.4g}", "100.0%"])
    return table(["time", "seconds", "share"], rows, right={1, 2})


def throughput_lines(est: Estimate) -> str:
    return "\n".join([
        f"throughput   {est.samples_per_second:,.2f} samples/s "
        f"(global batch {est.global_batch} in {est.iteration_seconds:.4g} s)",
        f"model FLOPs  {est.tflops_per_device:,.2f} TFLOP/s per device, "
        f"MFU {100 * est.mfu:.1f}% (bubble {100 * est.pipeline.bubble_fraction:.1f}% of ideal)",
    ])


def memory_table(memory: MemoryEstimate) -> str:
    """Device memory per pipeline rank at its peak; with CPU offload also the host column
    (offloaded model states per rank, held in host memory, not in the device peak)."""
    host = any(s.host_bytes for s in memory.stages)
    headers = ["stage", *MEMORY_PARTS, "peak GiB", *(["host GiB"] if host else []), "phase"]
    rows = []
    for s in memory.stages:
        parts = s.breakdown()
        rows.append([s.stage, *(gib(parts[p]) for p in MEMORY_PARTS), gib(s.peak_bytes),
                     *([gib(s.host_bytes)] if host else []), s.phase])
    return table(headers, rows, right=set(range(1, len(headers) - 1)))


def memory_verdict(memory: MemoryEstimate, fixes=()) -> str:
    if memory.fits:
        worst = memory.worst_stage
        line = (f"fits: peak {human_bytes(worst.peak_bytes)} of "
                f"{human_bytes(memory.device_bytes)} per device (stage {worst.stage})")
        host = max(s.host_bytes for s in memory.stages)
        return line + (f"; offloaded to host memory: {human_bytes(host)} per rank"
                       if host else "")
    lines = [memory.shortfall()]
    if fixes:
        lines.append("would fit or help: " + "; ".join(str(f) for f in fixes))
    return "\n".join(lines)


def memory_chart(memory: MemoryEstimate, path: str, title: str) -> None:
    """A stacked bar per stage (parts at the peak) against the device's memory."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlannerError("--chart needs matplotlib: pip install 'planner[chart]'") from None
    stages = [s.stage for s in memory.stages]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.5 * len(stages) + 4), 4.5))
    bottom = [0.0] * len(stages)
    for part, colour in zip(MEMORY_PARTS, PART_COLOURS):
        values = [s.breakdown()[part] / GiB for s in memory.stages]
        ax.bar(stages, values, bottom=bottom, label=part, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(memory.device_bytes / GiB, color="black", linestyle="--",
               label=f"device {memory.device_bytes / GiB:.0f} GiB")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per device")
    ax.set_xticks(stages)
    import textwrap

    ax.set_title("\n".join(textwrap.wrap(title, 60)), fontsize=9)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise PlannerError(f"--chart: cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)
