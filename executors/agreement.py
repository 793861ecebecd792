"""Ranks agree on the plan before any other collective: `agree_on_plan(plan, graph, device)`.

Ranks given different plans (DDP on one, ZeRO-3 on another) issue different collectives
and wait on each other until the process-group timeout. So `executors.apply` first
all-gathers a digest of what this rank will run: the SHA-256 of the plan's canonical JSON
(sorted keys, no whitespace), the model's fingerprint and the gradient clip's max norm
(its scalar all-reduce is a collective too), as a uint8 tensor (data, no pickle). Equal
digests cost one all-gather of 32 bytes per rank. Different digests make
every rank gather the plans' summaries (again as bytes) and raise the SAME one-line
PlannerError, naming the ranks of each plan and the first field they differ in:

    ranks disagree on the plan: rank 0 runs plan(pp=1, ..., tp1·dp2) and rank 1 runs
    plan(pp=1, ..., tp1·dp2·z3) (layers[0].dp_mode: replicate vs zero3); give every rank
    the same plan file
"""

from __future__ import annotations

import hashlib
import json

import torch
import torch.distributed as dist

from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.plan import ParallelPlan

DIGEST_BYTES = 32  # SHA-256


def plan_record(plan: ParallelPlan, graph: LayerGraph,
                max_grad_norm: float | None = None) -> dict:
    """What a rank runs, as plain JSON data: the plan's fields, the model's fingerprint
    and `apply`'s max_grad_norm (the clip's scalar all-reduce is a collective: a rank
    without it would leave the others waiting, different values diverge)."""
    return {
        "model_fingerprint": graph.fingerprint, "max_grad_norm": max_grad_norm,
        "global_batch": plan.global_batch, "micro_batch": plan.micro_batch,
        "num_microbatches": plan.num_microbatches, "schedule": plan.schedule.value,
        "precision": plan.precision.value, "optimizer": plan.optimizer,
        "optimizer_impl": plan.optimizer_impl, "virtual_stages": plan.virtual_stages,
        "stages": [[st.first_layer, st.last_layer, st.devices] for st in plan.stages],
        "layers": [{"tp": s.tp, "dp": s.dp, "dp_mode": s.dp_mode.value,
                    "sequence_parallel": s.sequence_parallel, "checkpoint": s.checkpoint.value}
                   for s in plan.layer_strategies],
    }


def canonical_json(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode("utf-8")


def plan_digest(plan: ParallelPlan, graph: LayerGraph,
                max_grad_norm: float | None = None) -> bytes:
    return hashlib.sha256(canonical_json(plan_record(plan, graph, max_grad_norm))).digest()


def _all_gather_bytes(data: bytes, device: torch.device) -> list[bytes]:
    """Every rank's `data` (any lengths), in rank order, as uint8 tensors."""
    world = dist.get_world_size()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    if data:
        padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    padded = padded.to(device)
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded)
    return [bytes(t[:int(n)].cpu().tolist()) for t, n in zip(out, sizes)]


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _first_difference(a, b, path: str = "") -> str | None:
    """The first key path where two JSON values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = _first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if a != b:
        show = lambda v: str(len(v)) + " entries" if isinstance(v, list) else str(v)  # noqa: E731
        return f"{path}: {show(a)} vs {show(b)}"
    return None


def disagreement_message(records: list[dict], summaries: list[str]) -> str:
    """One line naming the ranks of each distinct plan, where the first two differ and
    what to make the same (the plan file, or `apply`'s max_grad_norm where that differs)."""
    groups: dict[bytes, list[int]] = {}
    for rank, record in enumerate(records):
        groups.setdefault(canonical_json(record), []).append(rank)
    firsts = [ranks[0] for ranks in groups.values()]
    runs = [f"{_ranks(ranks)} run{'s' if len(ranks) == 1 else ''} {summaries[ranks[0]]}"
            for ranks in groups.values()]
    listed = ", ".join(runs[:-1]) + " and " + runs[-1]
    difference = _first_difference(records[firsts[0]], records[firsts[1]])
    advice = ("pass the same max_grad_norm to apply/auto_parallel on every rank"
              if difference.startswith("max_grad_norm:") else
              "give every rank the same plan file")
    return f"ranks disagree on the plan: {listed} ({difference}); {advice}"


def agree_on_plan(plan: ParallelPlan, graph: LayerGraph, device: torch.device,
                  max_grad_norm: float | None = None) -> None:
    """Return when every rank runs the same plan on the same model with the same
    `max_grad_norm`; else raise the same PlannerError on every rank (module docstring).
    One rank: nothing to agree on."""
    if dist.get_world_size() == 1:
        return
    record = plan_record(plan, graph, max_grad_norm)
    mine = torch.frombuffer(bytearray(plan_digest(plan, graph, max_grad_norm)),
                            dtype=torch.uint8).to(device)
    digests = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(digests, mine)
    if all(torch.equal(d, digests[0]) for d in digests):
        return
    payload = json.dumps({"record": record, "summary": str(plan)}).encode("utf-8")
    gathered = [json.loads(data) for data in _all_gather_bytes(payload, device)]
    raise PlannerError(disagreement_message([g["record"] for g in gathered],
                                            [g["summary"] for g in gathered]))
