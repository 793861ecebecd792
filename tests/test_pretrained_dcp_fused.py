"""`load_pretrained` of a DCP checkpoint into a TP plan that splits fused projections.

A `save_checkpoint` folder holds the model's order (`executors.checkpoint`); under TP a
fused [q | k | v] (GPT-2's Conv1D c_attn, Phi-3's qkv_proj) or [gate | up] (Phi-3's
gate_up_proj) is stored rank-major, and multi-query Falcon's query_key_value as
[q_r | k | v] (`executors.fused.FusedSplit`). On 2 gloo ranks: train one AdamW step under
TP 2, save, `load_pretrained` the folder into a fresh TP 2 model built from another seed.
Its full state dict must equal the saved one exactly, and its loss on the next batch must
equal one device's forward of the saved weights (the oracle: a plain module, no executor).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

import real_models as rm
from ir.trace import model_output_tensor
from dist_utils import spawn

ARCHS = ("gpt2", "phi3", "falcon")
TP = 2
OTHER_SEED = rm.SEED + 1  # the fresh model's weights differ from the saved ones


def _plan_and_graph(arch: str):
    from ir.plan import uniform_plan
    from ir.strategy import Precision
    from planner.models import load_layer_graph

    graph = load_layer_graph(f"hf:{os.path.join(rm.CONFIG_DIR, arch, 'config.json')}",
                             micro_batch=rm.EXAMPLE_ROWS, seq_len=rm.SEQ_LEN,
                             dtype=torch.float32)
    return uniform_plan(len(graph.layers), global_batch=rm.GLOBAL_BATCH, tp=TP,
                        precision=Precision.FP32), graph


def _save_then_load(rank: int, world_size: int, folder: str) -> dict:
    from executors import apply, full_state_dict
    from executors.checkpoint import save_checkpoint
    from executors.fused import fused_parameters
    from ir.errors import PlannerError

    out = {}
    for arch in ARCHS:
        plan, graph = _plan_and_graph(arch)
        batches = rm.global_batches(arch)

        def applied(seed):
            model, _, _, loss_fn = rm.build(arch, seed=seed)
            return apply(model, plan, graph, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                         optimizer_kwargs=dict(rm.OPTIMIZER_KWARGS))

        pm = applied(rm.SEED)
        pm.train_step(*batches[0])
        saved = full_state_dict(pm)
        path = save_checkpoint(pm, os.path.join(folder, arch))
        fresh = applied(OTHER_SEED)
        fused = sorted(fused_parameters(m for _, m in fresh.stage_modules))
        try:
            fresh.load_pretrained(path)
        except PlannerError as exc:
            out[arch] = {"error": str(exc), "fused": fused}
            continue
        loaded = full_state_dict(fresh)
        next_loss = fresh.train_step(*batches[1])  # the loss of the loaded weights
        out[arch] = {"saved": saved, "loaded": loaded, "next_loss": next_loss, "fused": fused}
    return out


@pytest.fixture(scope="module")
def ranks():
    with tempfile.TemporaryDirectory() as folder:  # the checkpoints, shared by the ranks
        return spawn(_save_then_load, TP, folder, timeout_s=400)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", ARCHS)
def test_dcp_checkpoint_loads_fused_rows_in_the_model_order_under_tp(ranks, arch):
    got = ranks[0][arch]
    assert got["fused"], f"{arch}: TP 2 split no fused projection; the test checks nothing"
    assert "error" not in got, got.get("error")
    assert got["saved"].keys() == got["loaded"].keys()
    for name, value in got["saved"].items():
        assert torch.equal(got["loaded"][name], value), name
    model, _, _, loss_fn = rm.build(arch, seed=OTHER_SEED)
    missing, unexpected = model.load_state_dict(got["saved"], strict=False)
    assert not unexpected and all(name not in got["saved"] for name in missing), missing
    inputs, target = rm.global_batches(arch)[1]
    with torch.no_grad():
        one_device = loss_fn(model_output_tensor(model(**inputs)), target).item()
    assert got["next_loss"] == pytest.approx(one_device, rel=rm.RTOL)
