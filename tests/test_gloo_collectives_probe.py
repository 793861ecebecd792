"""profile-cluster times on gloo the collectives ZeRO-2/3 units run (`ir.gloo_collectives`).

The collective probe's reduce-scatter and the executor's `GlooReduceScatter` (installed
through FSDP2's set_custom_reduce_scatter) both run `reduce_scatter_in_place`, an in-place
all-reduce of the flat input and a copy of this rank's chunk, never gloo's own
reduce_scatter (which clones the whole input first): checked on 2 gloo ranks by recording
the torch.distributed calls each makes. Likewise the probe's all-gather and the executor's
`GlooAllGather` both make gloo's list-output `dist.all_gather` (`all_gather_chunks`), the
call the DP-unit probe leaves out of its figure. The DP-unit probe's ZeRO-2/3 units carry
the same all-gather and reduce-scatter as the executor's units (`use_gloo_collectives`), so the
Python around their gloo calls is in the unit figure."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.dist_utils import spawn

# the collectives either path could reach (reduce_scatter_single where torch has it)
WATCHED = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter")


def _watch(names, record) -> list:
    """Wrap each torch.distributed function of `names` this torch has so every call first
    appends `record(name, args)` to the returned list (the wrapping lasts the process)."""
    calls = []
    for name in names:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def watched(*args, _name=name, _original=original, **kwargs):
            calls.append(record(_name, args))
            return _original(*args, **kwargs)

        setattr(dist, name, watched)
    return calls


def _record_calls(rank: int, world_size: int, payload) -> dict:
    from cost_models.collective_probes import _collective_calls
    from ir.gloo_collectives import GlooReduceScatter

    def record(name, args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return name, tuple(t.numel() for t in tensors), tuple(t.data_ptr() for t in tensors)

    calls = _watch(WATCHED, record)
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


def _unit_collectives(unit) -> list[tuple[str, str]]:
    """(all-gather, reduce-scatter) class names of each FSDP2 parameter group of `unit`."""
    state = unit._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]
    return [(type(g._all_gather_comm).__name__, type(g._reduce_scatter_comm).__name__)
            for g in groups]


def _probe_and_executor_units(rank: int, world_size: int, payload) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from cost_models.dp_unit_probe import dp_probe_stack
    from executors.data_parallel import apply_dp
    from ir.strategy import DPMode, LayerStrategy, Precision

    mesh = init_device_mesh("cpu", (world_size,))
    got = {}
    for mode in (DPMode.ZERO2, DPMode.ZERO3):
        probe = dp_probe_stack(mesh, mode, blocks=1)
        layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        unit = apply_dp(layer, LayerStrategy(dp=world_size, dp_mode=mode), mesh,
                        Precision.FP32)
        got[mode.name] = {"probe": [c for u in probe for c in _unit_collectives(u)],
                          "executor": _unit_collectives(unit)}
    return got


def test_the_dp_unit_probe_and_the_executor_install_the_same_gloo_collectives():
    """Every ZeRO-2/3 unit the DP-unit probe times all-gathers and reduce-scatters with
    the classes the executor's unit of that mode on gloo has (not FSDP2's defaults)."""
    for rank_result in spawn(_probe_and_executor_units, 2, None, timeout_s=200):
        for mode, got in rank_result.items():
            assert got["executor"] == [("GlooAllGather", "GlooReduceScatter")], (mode, got)
            assert set(got["probe"]) == set(got["executor"]), (mode, got)


# the all-gathers either path could reach (all_gather_single where torch has it)
WATCHED_ALL_GATHER = ("all_gather", "all_gather_into_tensor", "all_gather_single")


def _record_all_gathers(rank: int, world_size: int, payload) -> dict:
    """The torch.distributed all-gather calls of the collective probe's all-gather and of
    the executor's `GlooAllGather`, each as (name, numels of its tensor arguments, list
    arguments counted as one entry per tensor)."""
    from cost_models.collective_probes import _collective_calls
    from ir.gloo_collectives import GlooAllGather

    def shape(arg):
        if isinstance(arg, torch.Tensor):
            return arg.numel()
        if isinstance(arg, (list, tuple)):
            return tuple(shape(a) for a in arg)
        return None

    calls = _watch(WATCHED_ALL_GATHER, lambda name, args: (
        name, tuple(s for s in map(shape, args) if s is not None)))
    numel = 1024  # 4 KiB of fp32, as the probe sizes its message
    ops, _ = _collective_calls(dist, None, world_size, numel * 4, torch.device("cpu"))
    before = len(calls)
    ops["all_gather"]()
    probe = calls[before:]
    out = torch.empty(numel)
    before = len(calls)
    GlooAllGather()(out, torch.full((numel // world_size,), float(rank + 1)),
                    dist.group.WORLD)
    return {"probe": probe, "executor": calls[before:], "out": out}


def test_the_probe_and_the_executor_run_the_same_gloo_all_gather():
    """The collective probe's all-gather on gloo is the call `GlooAllGather` makes (gloo's
    allgather into a list of the output's chunks), the call the DP-unit probe leaves out
    of a unit's figure (`dp_unit_probe.FSDP_COLLECTIVES`), not `all_gather_single`."""
    from cost_models.dp_unit_probe import FSDP_COLLECTIVES

    for rank_result in spawn(_record_all_gathers, 2, timeout_s=200):
        # one all-gather of a 512-element shard into two 512-element chunks, each
        assert rank_result["probe"] == [("all_gather", ((512, 512), 512))]
        assert rank_result["executor"] == rank_result["probe"]
        assert rank_result["probe"][0][0] in FSDP_COLLECTIVES
        # the executor's output holds rank 0's shard then rank 1's
        assert torch.equal(rank_result["out"], torch.cat([torch.full((512,), 1.0),
                                                          torch.full((512,), 2.0)]))
