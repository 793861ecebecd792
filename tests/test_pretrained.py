"""Pretrained weights in and out of any plan (issue 15, item 2): `pm.load_pretrained` and
`pm.export_pretrained`.

A Hugging Face Llama and GPT-2 (tests/data/hf, tiny) are saved with `save_pretrained` in
several safetensors files. On 2 and 4 gloo ranks (ZeRO-3, TP 2, PP 2, TP 2 x PP 2 and
more) each plan is applied to a model built on the meta device (`executors.meta_init`,
`init="empty"`: no rank holds the model whole, its shards start uninitialised), loads the
checkpoint and trains 3 AdamW steps, which must equal single-process training of the
saved model (losses 1e-5 relative, parameters as in tests/test_exec_plans.py). Every rank's reads are counted through a wrapped `safe_open`:
each reads exactly the bytes of its own shards. Exports from TP 2 x PP 2 (fp32 in
several files per rank, bf16 in one per rank) load back through `from_pretrained` to
identical weights; a DCP checkpoint saved under TP 2 loads into ZeRO-3; a fused-
projection layout transform maps both ways on real shards; a missing, mis-shaped or
extra tensor is one line naming it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file, save_model

import real_models as rm
from dist_utils import spawn, train_one_device
from executors.pretrained_export import Entry, StreamingFile, plan_files
from executors.pretrained import HFNames
from executors.fused import FusedDim, FusedSplit, layout_transforms
from executors.shard_slices import shard_pieces, to_checkpoint_layout
from ir.strategy import LayerStrategy, Schedule, Stage
from test_exec_plans import assert_matches_reference, per_layer_plan, uniform

CKPT_SEED = 77  # the pretrained weights; the ranks build from rm.SEED, then load
SHARD_BYTES = "40KB"  # save_pretrained's max_shard_size: 7-14 files for these models
EXPORT_SHARD_BYTES = 64 << 10  # export_pretrained's: several files per rank
ONE = Schedule.ONE_F_ONE_B
def gpt2_interleaved(graph):
    """Each rank holds two stage modules (stages 0 and 2, 1 and 3), cut where GPT-2 may be
    cut (not between its two embeddings): wte | wpe h.0 | h.1 | ln_f lm_head."""
    stages = tuple(Stage(a, b, 1) for a, b in ((0, 0), (1, 2), (3, 3), (4, 5)))
    return per_layer_plan(stages, (LayerStrategy(),) * len(graph.layers), num_microbatches=4,
                          schedule=Schedule.INTERLEAVED, virtual_stages=2)


PLANS = {"zero3": uniform(dp=2, zero=3), "tp2": uniform(tp=2),
         "pp2": uniform(pp=2, micro_batch=2, schedule=ONE),
         "dp2-tp2-zero3": uniform(dp=2, tp=2, zero=3),
         "tp2xpp2": uniform(tp=2, pp=2, micro_batch=2, schedule=ONE),
         "pp2-interleaved": gpt2_interleaved}
CASES = {2: [("llama", "tp2"), ("llama", "zero3"), ("llama", "pp2"), ("gpt2", "zero3"),
             ("gpt2", "tp2"), ("gpt2", "pp2"), ("gpt2", "pp2-interleaved")],
         4: [("llama", "tp2xpp2"), ("gpt2", "tp2xpp2"), ("llama", "dp2-tp2-zero3")]}
# The most of the checkpoint's bytes one rank may read: its 1/world share plus the tensors
# it holds whole (norms; GPT-2's blocks, which TP leaves replicated) and, for GPT-2, both
# halves of the tied embedding (its embedding and its head copy each read their shard).
MAX_SHARE = {("llama", "tp2"): 0.55, ("llama", "zero3"): 0.55, ("llama", "pp2"): 0.55,
             ("gpt2", "zero3"): 0.6, ("gpt2", "tp2"): 1.0, ("gpt2", "pp2"): 0.6,
             ("gpt2", "pp2-interleaved"): 0.6,
             ("llama", "tp2xpp2"): 0.3, ("gpt2", "tp2xpp2"): 0.55,
             ("llama", "dp2-tp2-zero3"): 0.3}
C_ATTN = "transformer.h.0.attn.c_attn.weight"  # GPT-2's fused [q | k | v], along dim 1


# ----------------------------------------------------------------------------- set-up


def scratch_dir(prefix: str) -> str:
    """A temporary folder removed when the test session ends."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.lru_cache(maxsize=None)
def folder() -> str:
    """The checkpoints, built once per session: <arch>/ from save_pretrained, and single-
    file broken copies of Llama's: missing/, misshaped/, extra/."""
    root = scratch_dir("pretrained-")
    for arch in ("llama", "gpt2"):
        model = rm.build(arch, seed=CKPT_SEED)[0]
        model.save_pretrained(os.path.join(root, arch), max_shard_size=SHARD_BYTES)
    gpt2 = rm.build("gpt2", seed=CKPT_SEED)[0]
    # the hub's `gpt2` layout: a bare GPT2Model, names without "transformer.", no head
    gpt2.transformer.save_pretrained(os.path.join(root, "gpt2-bare"))
    # safetensors' own writer keeps the tied weight as lm_head.weight, not wte
    os.makedirs(os.path.join(root, "gpt2-save-model"))
    save_model(gpt2, os.path.join(root, "gpt2-save-model", "model.safetensors"))
    state = {k: v.clone() for k, v in
             rm.build("llama", seed=CKPT_SEED)[0].state_dict().items()}
    broken = {"missing": {k: v for k, v in state.items() if k != "model.norm.weight"},
              "misshaped": {**state, "model.norm.weight": torch.ones(32)},
              "extra": {**state, "model.layers.9.mlp.up_proj.weight": torch.ones(4, 4)}}
    for name, tensors in broken.items():
        os.makedirs(os.path.join(root, name))
        save_file(tensors, os.path.join(root, name, "model.safetensors"))
    return root


@functools.lru_cache(maxsize=None)
def graph_of(arch: str):
    from planner.models import load_layer_graph
    return load_layer_graph(f"hf:{os.path.join(rm.CONFIG_DIR, arch, 'config.json')}",
                            micro_batch=rm.EXAMPLE_ROWS, seq_len=rm.SEQ_LEN,
                            dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def reference(arch: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process training of the saved model on the same global batches."""
    model, _, _, loss_fn = rm.build(arch, seed=CKPT_SEED)
    return train_one_device(model, loss_fn, rm.global_batches(arch), dict(rm.OPTIMIZER_KWARGS))


# ----------------------------------------------------------------------------- ranks


class CountingOpen:
    """`safe_open` that counts the bytes every slice read returns: what a rank reads."""

    def __init__(self):
        self.bytes_read, self.files = 0, set()

    def __call__(self, path: str, framework: str, device: str = "cpu"):
        self.files.add(os.path.basename(path))
        return _Handle(safe_open(path, framework=framework, device=device), self)


class _Handle:
    def __init__(self, handle, counter: CountingOpen):
        self.handle, self.counter = handle, counter

    def keys(self):
        return self.handle.keys()

    def get_slice(self, name: str):
        return _Slice(self.handle.get_slice(name), self.counter)

    def get_tensor(self, name: str):
        return self.get_slice(name)[:]


class _Slice:
    def __init__(self, sl, counter: CountingOpen):
        self.sl, self.counter = sl, counter

    def get_shape(self):
        return self.sl.get_shape()

    def __getitem__(self, index):
        data = self.sl[index]
        self.counter.bytes_read += data.numel() * data.element_size()
        return data


def _local_bytes(pm) -> int:
    from executors.pretrained import local_targets
    from executors.shard_slices import local_tensor
    return sum(local_tensor(t).numel() * local_tensor(t).element_size()
               for _, t, _ in local_targets(pm))


def _errors(pm, root: str) -> dict[str, str]:
    from ir.errors import PlannerError
    out = {}
    for name in ("missing", "misshaped", "extra"):
        try:
            pm.load_pretrained(os.path.join(root, name))
            out[name] = "loaded"
        except PlannerError as exc:
            out[name] = str(exc)
    return out


def _fused_transform(pm, root: str, rank: int, out_dir: str) -> dict:
    """GPT-2's c_attn under TP 2 is stored rank-major (`executors.fused`): the loaded shard
    must be this rank's [q | k | v] columns of the checkpoint, and the export must undo
    the order."""
    from executors.shard_slices import local_tensor
    transform = layout_transforms(m for _, m in pm.stage_modules)[C_ATTN]
    index = json.load(open(os.path.join(root, "gpt2", "model.safetensors.index.json")))
    saved = load_file(os.path.join(root, "gpt2", index["weight_map"][C_ATTN]))[C_ATTN]
    width = saved.shape[1] // 3 // 2  # columns of q (and of k, of v) per rank
    starts = [part * 2 * width + rank * width for part in range(3)]  # [q_r | k_r | v_r]
    expected = torch.cat([saved[:, start:start + width] for start in starts], dim=1)
    pm.load_pretrained(os.path.join(root, "gpt2"))
    shard_ok = torch.equal(local_tensor(pm.module.get_parameter(C_ATTN)), expected)
    pm.export_pretrained(out_dir)
    exported = {}
    for name in os.listdir(out_dir):
        if name.endswith(".safetensors"):
            exported.update(load_file(os.path.join(out_dir, name)))
    return {"shard_ok": shard_ok, "export_ok": torch.equal(exported[C_ATTN], saved),
            "dim": transform.dim}


def run_plans(rank: int, world_size: int, payload: dict) -> dict:
    """Every case: apply (another seed), load with counted reads, train, gather; then the
    case's extras (DCP save/load, errors, export, the layout transform)."""
    import executors.pretrained as pretrained
    from executors import apply, full_state_dict, meta_init
    from executors.checkpoint import save_checkpoint

    root, scratch = payload["root"], payload["scratch"]
    results = {}
    for arch, plan_name, plan, graph, batches in payload["cases"]:
        key = f"{arch}/{plan_name}"
        with meta_init():  # no values: every shard's comes from the checkpoint
            model, _, _, loss_fn = rm.build(arch)
        pm = apply(model, plan, graph, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                   optimizer_kwargs=dict(rm.OPTIMIZER_KWARGS), init="empty")
        counter = CountingOpen()
        pretrained.safe_open, original = counter, pretrained.safe_open
        try:
            report = pm.load_pretrained(os.path.join(root, arch))
        finally:
            pretrained.safe_open = original
        out = {"bytes_read": counter.bytes_read, "report": report, "files": counter.files,
               "local_bytes": _local_bytes(pm),
               "losses": [pm.train_step(inputs, target) for inputs, target in batches]}
        state = full_state_dict(pm)
        out["state"] = state if rank == 0 else None
        dcp_dir = os.path.join(scratch, "dcp-llama-tp2")
        if key == "llama/tp2":
            save_checkpoint(pm, dcp_dir, step=3)
        if key == "gpt2/tp2":
            out["transform"] = _fused_transform(pm, root, rank, os.path.join(scratch, "fused"))
        if key == "llama/zero3":
            out["errors"] = _errors(pm, root)
            out["dcp_report"] = pm.load_pretrained(dcp_dir)  # the folder of step-N folders
            loaded = full_state_dict(pm)
            out["dcp_state"] = loaded if rank == 0 else None
        if key == "gpt2/pp2":  # the head's stage finds lm_head.weight as "wte.weight"
            pm.load_pretrained(os.path.join(root, "gpt2-bare"))
            loaded = full_state_dict(pm)
            out["bare_state"] = loaded if rank == 0 else None
        if key == "gpt2/zero3":  # the embedding's copy is found as "lm_head.weight"
            pm.load_pretrained(os.path.join(root, "gpt2-save-model"))
            loaded = full_state_dict(pm)
            out["save_model_state"] = loaded if rank == 0 else None
        if plan_name in ("tp2xpp2", "pp2-interleaved"):
            out["export"] = pm.export_pretrained(os.path.join(scratch, f"export-{arch}"),
                                                 max_shard_bytes=EXPORT_SHARD_BYTES)
        if key == "llama/tp2xpp2":  # default max_shard_bytes, bf16
            pm.export_pretrained(os.path.join(scratch, "export-llama-bf16"), dtype=torch.bfloat16)
        results[key] = out
    if world_size == 2:
        results["llama/meta-auto-tp2"] = _meta_auto_parallel(root, PLANS["tp2"](graph_of("llama")))
    return results


def _meta_auto_parallel(root: str, plan) -> dict:
    """A meta-built Llama (no rank ever holds it whole) through
    `auto_parallel(..., checkpoint=)`: each rank loads only its shards, then trains."""
    from executors import full_state_dict, meta_init
    from planner import auto_parallel

    with meta_init():
        model, inputs, target, loss_fn = rm.build("llama")
    pm = auto_parallel(model, (inputs, target), loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                       optimizer_kwargs=dict(rm.OPTIMIZER_KWARGS), plan=plan,
                       checkpoint=os.path.join(root, "llama"))
    losses = [pm.train_step(batch) for batch in rm.global_batches("llama")]
    return {"losses": losses, "state": full_state_dict(pm.parallel)}


@functools.lru_cache(maxsize=None)
def results_for(world: int) -> tuple[list[dict], str]:
    scratch = scratch_dir(f"pretrained-{world}r-")
    cases = [(arch, name, PLANS[name](graph_of(arch)), graph_of(arch), rm.global_batches(arch))
             for arch, name in CASES[world]]
    payload = {"root": folder(), "scratch": scratch, "cases": cases}
    return spawn(run_plans, world, payload, timeout_s=400), scratch


ALL = [(world, arch, name) for world, cases in CASES.items() for arch, name in cases]


# ----------------------------------------------------------------------------- tests


def test_checkpoints_have_several_files():
    for arch in ("llama", "gpt2"):
        files = [n for n in os.listdir(os.path.join(folder(), arch)) if n.endswith(".safetensors")]
        assert len(files) >= 3, files


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world, arch, plan", ALL, ids=[f"{w}r-{a}-{p}" for w, a, p in ALL])
def test_load_then_train_matches_one_device(world, arch, plan):
    ranks, _ = results_for(world)
    got = ranks[0][f"{arch}/{plan}"]
    assert_matches_reference({"losses": got["losses"], "state": got["state"]}, *reference(arch))


@pytest.mark.multiprocess
@pytest.mark.parametrize("world, arch, plan", ALL, ids=[f"{w}r-{a}-{p}" for w, a, p in ALL])
def test_each_rank_reads_its_share(world, arch, plan):
    """Bytes read through safe_open equal the bytes of the rank's own shards (the loader
    reads nothing twice and nothing it does not hold); sharded plans read a fraction of
    the checkpoint."""
    ranks, _ = results_for(world)
    total = sum(t.numel() * t.element_size()
                for t in _checkpoint_tensors(os.path.join(folder(), arch)).values())
    for rank, result in enumerate(ranks):
        got = result[f"{arch}/{plan}"]
        assert got["bytes_read"] == got["local_bytes"] == got["report"].bytes_read, (rank, got)
        assert got["bytes_read"] <= MAX_SHARE[arch, plan] * total, (rank, got["bytes_read"])
        print(f"{world}r {arch} {plan} rank {rank}: read {got['bytes_read']} of {total} bytes "
              f"({got['bytes_read'] / total:.0%}), {len(got['files'])} files")


def _checkpoint_tensors(path: str) -> dict[str, torch.Tensor]:
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, name)))
    return out


EXPORTS = [(4, "llama", "tp2xpp2"), (4, "gpt2", "tp2xpp2"), (2, "gpt2", "pp2-interleaved")]


@pytest.mark.multiprocess
@pytest.mark.parametrize("world, arch, plan", EXPORTS, ids=[f"{w}r-{a}-{p}" for w, a, p in EXPORTS])
def test_export_round_trips_through_from_pretrained(world, arch, plan):
    from transformers import AutoModelForCausalLM

    ranks, scratch = results_for(world)
    out = os.path.join(scratch, f"export-{arch}")
    files = [n for n in os.listdir(out) if n.endswith(".safetensors")]
    assert len(files) >= world and os.path.isfile(os.path.join(out, "model.safetensors.index.json"))
    trained = ranks[0][f"{arch}/{plan}"]["state"]
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    got = dict(loaded.named_parameters(remove_duplicate=False))
    assert sorted(got) == sorted(trained), sorted(set(got) ^ set(trained))
    for name, value in trained.items():
        assert torch.equal(got[name].detach(), value), name


@pytest.mark.multiprocess
def test_export_in_bf16_writes_one_file_per_rank():
    """Below max_shard_bytes every rank writes one file of the tensors it owns."""
    from transformers import AutoModelForCausalLM

    ranks, scratch = results_for(4)
    out = os.path.join(scratch, "export-llama-bf16")
    assert sorted(n for n in os.listdir(out) if n.endswith(".safetensors")) == [
        f"model-{k:05d}-of-00004.safetensors" for k in range(1, 5)]
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    for name, value in ranks[0]["llama/tp2xpp2"]["state"].items():
        assert torch.equal(loaded.get_parameter(name).detach(), value.to(torch.bfloat16)), name


@pytest.mark.multiprocess
def test_dcp_checkpoint_loads_into_another_plan():
    """save_checkpoint under TP 2 after training; load_pretrained into ZeRO-3: the same
    weights exactly (DCP reshards)."""
    ranks, _ = results_for(2)
    saved = ranks[0]["llama/tp2"]["state"]
    got = ranks[0]["llama/zero3"]
    assert got["dcp_report"].format == "dcp"
    for name, value in saved.items():
        assert torch.equal(got["dcp_state"][name], value), name


@pytest.mark.multiprocess
def test_bare_base_model_checkpoint_loads():
    """A checkpoint of GPT2Model (no `transformer.` prefix, no lm_head) fills every copy
    of GPT2LMHeadModel's tied embedding, on both pipeline stages."""
    ranks, _ = results_for(2)
    saved = _checkpoint_tensors(os.path.join(folder(), "gpt2"))
    got = ranks[0]["gpt2/pp2"]["bare_state"]
    assert sorted(got) == sorted([*saved, "lm_head.weight"])
    for name, value in saved.items():
        assert torch.equal(got[name], value), name
    assert torch.equal(got["lm_head.weight"], saved["transformer.wte.weight"])


@pytest.mark.multiprocess
def test_tied_weight_stored_under_the_head_name_loads():
    ranks, _ = results_for(2)
    saved = _checkpoint_tensors(os.path.join(folder(), "gpt2"))
    got = ranks[0]["gpt2/zero3"]["save_model_state"]
    for name, value in saved.items():
        assert torch.equal(got[name], value), name
    assert torch.equal(got["lm_head.weight"], saved["transformer.wte.weight"])


@pytest.mark.multiprocess
def test_meta_build_loads_a_checkpoint_through_auto_parallel():
    ranks, _ = results_for(2)
    got = ranks[0]["llama/meta-auto-tp2"]
    assert_matches_reference(got, *reference("llama"))


@pytest.mark.multiprocess
def test_layout_transform_maps_both_ways():
    ranks, _ = results_for(2)
    for rank, result in enumerate(ranks):
        assert result["gpt2/tp2"]["transform"] == {"shard_ok": True, "export_ok": True,
                                                   "dim": 1}, rank


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind, words", [
    ("missing", "has no tensor 'model.norm.weight' for the model's parameter"),
    ("misshaped", "model.safetensors: tensor 'model.norm.weight' is [32] but the model's "
                  "'model.norm.weight' is [64]"),
    ("extra", "holds 1 tensors this model lacks (e.g. 'model.layers.9.mlp.up_proj.weight' "
              "in model.safetensors)"),
])
def test_bad_checkpoint_is_one_line(kind, words):
    ranks, _ = results_for(2)
    messages = {r["llama/zero3"]["errors"][kind] for r in ranks}
    assert len(messages) == 1, messages  # every rank raises the same error
    message = messages.pop()
    assert words in message and "\n" not in message, message


# ----------------------------------------------------------------------------- pure logic


def test_fused_sections_undo_their_order():
    saved = torch.arange(8 * 3).view(8, 3)
    transform = FusedDim(FusedSplit((4, 2, 2), 2, (("weight", 0),)), 0)
    stored = saved[transform.checkpoint_index(torch.arange(8), 8)]
    assert stored[:4, 0].tolist() == [0, 3, 12, 18]  # rank 0: q rows 0-1, k row 0, v row 0
    assert torch.equal(to_checkpoint_layout(stored, transform), saved)
    assert [(p.local, p.full) for p in shard_pieces(stored, transform)][:2] == [
        ((slice(0, 2), slice(0, 3)), (slice(0, 2), slice(0, 3))),
        ((slice(2, 3), slice(0, 3)), (slice(4, 5), slice(0, 3)))]


def test_streaming_file_is_a_safetensors_file(tmp_path):
    tensors = {"w": torch.randn(3, 5), "b": torch.randn(7).to(torch.bfloat16),
               "flag": torch.tensor([True, False]), "step": torch.tensor(4),
               "none": torch.zeros(0, 3)}
    entries = [Entry(n, tuple(t.shape), t.dtype) for n, t in tensors.items()]
    out = StreamingFile(str(tmp_path / "x.safetensors"), entries)
    for name, value in tensors.items():
        out.write(name, value)
    got = load_file(str(tmp_path / "x.safetensors"))
    assert set(got) == set(tensors)
    for name, value in tensors.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name


def test_checkpoint_names_of_a_parameter():
    names = HFNames({"lm_head.weight": "transformer.wte.weight"}, "transformer", ())
    assert names.candidates("lm_head.weight") == [
        "lm_head.weight", "transformer.lm_head.weight", "transformer.wte.weight", "wte.weight"]
    assert names.candidates("transformer.wte.weight") == [
        "transformer.wte.weight", "wte.weight", "lm_head.weight", "transformer.lm_head.weight"]


def test_export_spreads_tensors_over_holders():
    """Tensors held by both ranks go to the less loaded one; a tied weight is left out
    when its source is written; files split at max_shard_bytes."""
    f32 = torch.float32
    held = [[Entry("a", (100,), f32), Entry("b", (100,), f32), Entry("lm_head.weight", (4,), f32)],
            [Entry("a", (100,), f32), Entry("b", (100,), f32), Entry("wte.weight", (4,), f32)]]
    names = HFNames({"lm_head.weight": "wte.weight"}, "", ())
    files = plan_files(held, names, max_shard_bytes=400)
    assert [(rank, [e.name for e in entries]) for rank, entries in files] == [
        (0, ["a"]), (1, ["b"]), (1, ["wte.weight"])]
