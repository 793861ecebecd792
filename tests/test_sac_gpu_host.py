"""Op-level selective checkpointing's host cost on GPU specs: the ops through SAC's two
dispatch modes (counted on a real block against the layer IR), the kit's probe on any
device, and its price where the host outlasts the kernels (a GPU overlaps the two).

On the H100 (2026-11-25, /work/notes/gpu/3) llama3.2-1b under SELECTIVE spent 86.8 ms of
host a step in 3870 `PythonDispatchMode` calls (SAC's modes) and ran host-bound; the
h100-80g preset priced none of it (no probe on GPUs)."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

from cost_models import checkpoint_probes
from cost_models.checkpoint_probes import (CHECKPOINT_FIELDS, cached_mode_ops, forward_detaches,
                                          probed, rerun_ops, sac_mode_ops)
from cost_models.clusters import H100_CALIBRATION_PATH, get_cluster
from cost_models.common import StepConfig
from cost_models.compute import layer_compute
from ir.checkpoint_policy import selective_policy
from ir.cluster import ClusterSpec
from ir.strategy import Checkpoint, LayerStrategy, Precision

US = 1e-6
# Made-up per-op figures of SAC's caching (forward) and cached (recompute) modes, in the
# range the H100 host showed (22.4 us per PythonDispatchMode call)
FORWARD_OP_S, RECOMPUTE_OP_S = 20 * US, 30 * US
# The host's own framework seconds per op (the preset's measured figure, set here so the
# sums below do not move with it): the llama-tiny block's forward host (117 x 10 us)
# outlasts its H100 kernels, so the layer is priced at its host's time
HOST_OP_S = 10 * US
CONFIG = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                    precision=Precision.FP32, device_type="cuda")


@functools.lru_cache(maxsize=None)
def _llama_block():
    from planner.models import load_layer_graph

    return load_layer_graph("llama-tiny", micro_batch=1, dtype=torch.float32).layer("blocks.0")


def _h100(**figures) -> ClusterSpec:
    """The h100-80g preset, one GPU, HOST_OP_S a dispatched op, its checkpoint figures
    replaced: 0 but `figures`."""
    spec = get_cluster("h100-80g")
    cal = dataclasses.replace(spec.kernel_calibration,
                              **{**{f: 0.0 for f in CHECKPOINT_FIELDS}, **figures})
    return dataclasses.replace(spec, devices_per_node=1, op_overhead_s=HOST_OP_S,
                               backward_op_overhead_s=HOST_OP_S, kernel_calibration=cal)


SAC_ONLY = dict(selective_forward_op_s=FORWARD_OP_S, selective_forward_kept_op_s=FORWARD_OP_S,
                selective_recompute_op_s=RECOMPUTE_OP_S)


def _priced(spec, mode):
    return layer_compute(_llama_block(), LayerStrategy(checkpoint=mode), spec, CONFIG)


class _SacCounter:
    """Counts the ops through SAC's caching and cached dispatch modes while entered."""

    def __enter__(self):
        self.counts = {"caching": 0, "cached": 0}
        self.saved = []
        for key, mode in (("caching", torch_checkpoint._CachingTorchDispatchMode),
                          ("cached", torch_checkpoint._CachedTorchDispatchMode)):
            original = mode.__torch_dispatch__
            self.saved.append((mode, original))

            def counted(mode_self, func, types, args=(), kwargs=None, _key=key,
                        _original=original):
                self.counts[_key] += 1
                return _original(mode_self, func, types, args, kwargs)

            mode.__torch_dispatch__ = counted
        return self

    def __exit__(self, *exc):
        for mode, original in self.saved:
            mode.__torch_dispatch__ = original


class _Detaches(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ == "detach"
        return func(*args, **(kwargs or {}))


def test_the_ir_counts_the_ops_through_sacs_modes_on_a_real_block():
    """llama-tiny's block run under the executor's SELECTIVE checkpoint
    (`executors.checkpointing.apply_ac`) on CPU: its forward passes `ops_fwd` ops through
    SAC's caching mode and its recompute `cached_mode_ops` through the cached mode (114
    and 145), each less the plain forward's detaches of saved outputs (rsqrt's twice,
    softmax's: 3), which the IR counts in `ops_fwd` and a checkpointed pass does not make:
    `sac_mode_ops`, what the model prices."""
    from executors.checkpointing import apply_ac
    from planner.models import load_model

    layer = _llama_block()
    block = load_model("llama-tiny", 1, None, device="cpu", seed=0).module.blocks["0"].train()
    x = torch.randn(1, 32, 64, requires_grad=True)
    with _Detaches() as plain:
        block(x)
    apply_ac(block, Checkpoint.SELECTIVE)
    with _SacCounter() as sac:
        block(x).sum().backward()
    assert plain.count == forward_detaches(layer) == 3
    assert (sac.counts["caching"], sac.counts["cached"]) == sac_mode_ops(layer) == (114, 145)
    assert sac_mode_ops(layer) == (layer.ops_fwd - 3, cached_mode_ops(layer) - 3)


def test_a_selective_layer_on_a_gpu_spec_pays_count_x_figure_on_the_host():
    """On an H100 spec with SAC's per-op figures the llama-tiny block's tiny kernels
    finish before its host does (a GPU takes the longer of the two, `compute.with_host`):
    SELECTIVE's forward costs its host, the ops x HOST_OP_S plus the ops through SAC's
    caching mode x its figure: exactly that count x figure more than without the figures.
    Its recompute: the rerun ops x HOST_OP_S plus the cached mode's ops x its figure.
    Backward and NONE are unchanged."""
    layer = _llama_block()
    before, after = _h100(), _h100(**SAC_ONLY)
    assert not probed(before.kernel_calibration) and probed(after.kernel_calibration)
    sel_before = _priced(before, Checkpoint.SELECTIVE)
    sel_after = _priced(after, Checkpoint.SELECTIVE)
    forward_ops, recompute_ops = sac_mode_ops(layer)
    assert sel_before.forward_s == pytest.approx(layer.ops_fwd * HOST_OP_S)  # host-bound
    assert sel_after.forward_s - sel_before.forward_s == pytest.approx(
        forward_ops * FORWARD_OP_S)
    assert sel_after.recompute_s == pytest.approx(
        rerun_ops(layer) * HOST_OP_S + recompute_ops * RECOMPUTE_OP_S)
    assert sel_after.backward_s == sel_before.backward_s
    assert _priced(after, Checkpoint.NONE) == _priced(before, Checkpoint.NONE)


def test_where_the_kernels_outlast_the_host_sac_adds_nothing():
    """The same block with no host of its own and a SAC figure a thousand times smaller:
    the host (114 x 20 ns) stays under the kernels, and a GPU overlaps the two
    (`compute.with_host`): priced as without."""
    tiny = {k: v / 1000 for k, v in SAC_ONLY.items()}
    before = _priced(dataclasses.replace(_h100(), op_overhead_s=0.0, backward_op_overhead_s=0.0),
                     Checkpoint.SELECTIVE)
    after = _priced(dataclasses.replace(_h100(**tiny), op_overhead_s=0.0,
                                        backward_op_overhead_s=0.0), Checkpoint.SELECTIVE)
    assert after.forward_s == before.forward_s and after.recompute_s == before.recompute_s


def test_an_older_gpu_spec_without_the_figures_loads_and_prices_as_before(tmp_path):
    """A GPU spec written before the probe (no checkpoint fields in its kernel tables)
    loads with 0 in each and prices SELECTIVE as kernels alone: its forward is NONE's."""
    data = json.loads(H100_CALIBRATION_PATH.read_text())
    for field in CHECKPOINT_FIELDS:
        data["kernel_calibration"].pop(field, None)
    path = tmp_path / "old-h100.json"
    path.write_text(json.dumps(data))
    old = ClusterSpec.load(path)
    assert not probed(old.kernel_calibration)
    spec = dataclasses.replace(_h100(), kernel_calibration=old.kernel_calibration)
    sel, none = _priced(spec, Checkpoint.SELECTIVE), _priced(spec, Checkpoint.NONE)
    assert sel.forward_s == none.forward_s and sel == _priced(_h100(), Checkpoint.SELECTIVE)


def test_the_probe_runs_at_a_devices_rounds(monkeypatch):
    """The kit's probe with a device's fewer rounds (a GPU's: `DEVICE_ROUNDS`), here on
    CPU at 1 round of 2 runs: every figure written, finite, >= 0, some > 0."""
    monkeypatch.setitem(checkpoint_probes.DEVICE_ROUNDS, "cpu", (1, 2))
    fields = checkpoint_probes.checkpoint_host_seconds("cpu").calibration_fields()
    assert set(fields) == set(CHECKPOINT_FIELDS)
    assert all(0.0 <= v < 1e-2 for v in fields.values()) and any(fields.values())


def test_the_probe_chains_run_on_the_device_given():
    """Every probe chain's tensors live on the device the probe is given (CUDA in the
    kit; meta here, which decomposes as CPU does): same outputs' device, same counts."""
    for name, chain in checkpoint_probes._chains(torch, "meta").items():
        x = torch.ones(2, checkpoint_probes.PROBE_WIDTH, device="meta", requires_grad=True)
        assert chain(x, 2).device.type == "meta", name
        on_meta = checkpoint_probes._counts(torch, chain, 2, "meta")
        on_cpu = checkpoint_probes._counts(torch, checkpoint_probes._chains(torch)[name], 2)
        assert on_meta == on_cpu, name
