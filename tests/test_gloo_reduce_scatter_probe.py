"""profile-cluster's reduce-scatter on gloo times the path ZeRO-2/3 units take: the
executor's `GlooReduceScatter` (installed through FSDP2's set_custom_reduce_scatter) and
the probe's call both run `ir.gloo_reduce_scatter.reduce_scatter_in_place`, an in-place
all-reduce of the flat input and a copy of this rank's chunk, never gloo's own
reduce_scatter (which clones the whole input first). Checked on 2 gloo ranks by recording
the torch.distributed calls each makes."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.dist_utils import spawn

# the collectives either path could reach (reduce_scatter_single where torch has it)
WATCHED = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter")


def _record_calls(rank: int, world_size: int, payload) -> dict:
    from cost_models.collective_probes import _collective_calls
    from executors.host_collectives import GlooReduceScatter

    calls = []
    for name in WATCHED:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def watched(*args, _name=name, _original=original, **kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            calls.append((_name, tuple(t.numel() for t in tensors),
                          tuple(t.data_ptr() for t in tensors)))
            return _original(*args, **kwargs)

        setattr(dist, name, watched)
    numel = 1024  # 4 KiB of fp32, as the probe sizes its message
    ops, full = _collective_calls(dist, None, world_size, numel * 4, torch.device("cpu"))
    before = len(calls)
    ops["reduce_scatter"]()
    probe = [(name, numels, ptrs == (full.data_ptr(),)) for name, numels, ptrs in calls[before:]]
    flat = torch.full((numel,), float(rank + 1))
    out = torch.empty(numel // world_size)
    before = len(calls)
    GlooReduceScatter()(out, flat, dist.group.WORLD)
    executor = [(name, numels, ptrs == (flat.data_ptr(),))
                for name, numels, ptrs in calls[before:]]
    return {"probe": probe, "executor": executor, "out": out}


def test_the_probe_and_the_executor_run_the_same_gloo_reduce_scatter():
    for rank_result in spawn(_record_calls, 2, timeout_s=200):
        # one all-reduce of the whole flat input, in place (on the tensor passed in), each
        assert rank_result["probe"] == [("all_reduce", (1024,), True)]
        assert rank_result["executor"] == rank_result["probe"]
        # the executor's chunk holds the ranks' sum: 1 + 2
        assert torch.equal(rank_result["out"], torch.full((512,), 3.0))
