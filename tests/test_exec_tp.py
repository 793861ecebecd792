"""Tensor parallelism on real Hugging Face attention code (tiny configs, random init).

Each entry splits a model with TP 2 over 2 gloo ranks, or 4 with a data-parallel pair
(one spawn per world size runs all its entries), and must
either equal single-device training over STEPS AdamW steps (fp32, the tolerances of
`test_exec_plans`), or be refused before the first step with a one-line PlannerError
whose text the entry names. One entry breaks a split on purpose (after `apply_tp`, one
attention module gets its global head count back, as OPT's code had it) and the
self-check must name that layer; another breaks the re-layout between the embedding
and the first sequence-parallel block, and one makes gathering a fused projection forget
its reorder: the self-check must name that block each time.

Fused projections (GPT-2's Conv1D c_attn, Phi-3's qkv_proj and gate_up_proj) must really
split: rank 0's shard right after `apply` is, for each packed projection, its first half
(half of q, half of k, half of v), cut here from the single-device weights; the
attention holds its local head count; a full state dict loaded back and gathered again
is unchanged; a checkpoint saved under TP resumes under plain DDP in the model's own
layout and takes the next step as the TP run does, and a Hugging Face export under TP
loads back (`load_pretrained`) under the same plan unchanged. Multi-query Falcon's
query_key_value keeps its one k and v head whole on every rank (`FusedSplit.shared`).
"""

from __future__ import annotations

import functools
import importlib
import tempfile
from dataclasses import dataclass

import pytest
import torch

from executors import apply, full_state_dict
from executors.checkpoint import load_checkpoint, save_checkpoint
from executors.fused import FusedDim, FusedSplit
from executors.shard_slices import shard_pieces, to_checkpoint_layout
from executors.state import load_full_state_dict
from ir.errors import PlannerError
from ir.tp import fused_shared, head_counts
from ir.plan import PlanDocument, model_identity, uniform_plan
from ir.strategy import Precision
from planner.models import load_layer_graph, load_model
from planner.plan_report import strategy_table
from test_exec_plans import assert_matches_reference, assert_params_match, optimizer_kwargs

from dist_utils import spawn, train_one_device, zero_dropout

# the module, not the `apply` function `executors` re-exports under the same name
apply_module = importlib.import_module("executors.apply")
layout_module = importlib.import_module("executors.layout")

SEQ = 16  # tokens per sample: divisible by the TP degree (sequence parallelism)
GLOBAL_BATCH = 8
STEPS = 3
SEED = 1234
RTOL = 1e-5  # as test_exec_plans: losses within RTOL, parameters by its norm rule
TP = 2
BROKEN_LAYER = "model.decoder.layers.1"  # the OPT block whose attention the test breaks


def spec(arch: str) -> str:
    return f"hf:tests/data/hf/{arch}/config.json"


@dataclass(frozen=True)
class Case:
    name: str
    arch: str
    sequence_parallel: bool = False
    refused: str | None = None  # text the one-line PlannerError must hold; None: must match
    # BROKEN_LAYER's attention after the split: "global" gets the global head count back
    # (it then fails to run), "merge" runs its local heads as one (silently wrong)
    break_heads: str | None = None
    self_check: bool = True
    dp: int = 1  # > 1: 2·dp ranks, each TP pair a data-parallel replica (ZeRO stage `zero`)
    zero: int = 0
    differs: bool = False  # the run must NOT match one device (a broken, unchecked split)
    break_relayout: bool = False  # every re-layout returns its hidden features reversed
    break_fused_order: bool = False  # gathering a fused projection forgets the reorder
    # (parameter, its split dim): must be split TP ways, rank 0 holding the first half of
    # each packed projection; `attention`: its head count must be the local one
    split: tuple[tuple[str, int], ...] = ()
    attention: str = ""
    checkpoint: bool = False  # save under this plan, resume under DDP on the same ranks


GPT2_SPLIT = (("transformer.h.0.attn.c_attn.weight", 1), ("transformer.h.0.attn.c_attn.bias", 0),
              ("transformer.h.0.attn.c_proj.weight", 0), ("transformer.h.0.mlp.c_fc.weight", 1),
              ("transformer.h.1.mlp.c_proj.weight", 0))
PHI3_SPLIT = (("model.layers.0.self_attn.qkv_proj.weight", 0),
              ("model.layers.0.self_attn.o_proj.weight", 1),
              ("model.layers.1.mlp.gate_up_proj.weight", 0),
              ("model.layers.1.mlp.down_proj.weight", 1))

FALCON_SPLIT = (("transformer.h.0.self_attention.query_key_value.weight", 0),
                ("transformer.h.0.self_attention.dense.weight", 1))
FALCON_GQA_SPLIT = (("transformer.h.1.self_attention.query_key_value.weight", 0),
                    ("transformer.h.1.self_attention.dense.weight", 1))

CASES = [
    Case("opt", "opt"),
    Case("opt-sp", "opt", sequence_parallel=True,  # fc1 sits in the block itself
         refused="sequence parallel gathers the input of the module holding"),
    Case("opt-merged-heads", "opt", refused=f"layer {BROKEN_LAYER}: its tensor-parallel "
         "run (tp=2) differs from the unsplit layer by up to", break_heads="merge"),
    # the same break without the self-check trains silently wrong: what the check is for
    Case("opt-merged-heads-unchecked", "opt", break_heads="merge", self_check=False,
         differs=True),
    Case("opt-global-heads", "opt", refused=f"layer {BROKEN_LAYER}: its tensor-parallel "
         "run (tp=2) fails", break_heads="global"),
    Case("llama", "llama"),
    Case("gemma", "gemma"),  # one KV head: k/v whole on both ranks, gradients summed
    Case("gemma-sp", "gemma", sequence_parallel=True),
    Case("qwen3", "qwen3"),
    Case("qwen3-sp", "qwen3", sequence_parallel=True),
    # fused [q|k|v] / [gate|up] split per part; GPT-2's Conv1D on the transposed dim
    Case("gpt2", "gpt2", split=GPT2_SPLIT, attention="transformer.h.0.attn", checkpoint=True),
    Case("phi3", "phi3", split=PHI3_SPLIT, attention="model.layers.0.self_attn"),
    Case("phi3-sp", "phi3", sequence_parallel=True),
    # grouped-query: q = 4 heads, k = v = 2 heads of 16 packed in one qkv_proj
    Case("phi3-gqa", "phi3_gqa", split=PHI3_SPLIT, attention="model.layers.0.self_attn"),
    Case("gpt2-broken-fused-order", "gpt2", break_fused_order=True,
         refused="layer transformer.h.0: its fused attn.c_attn.weight gathers back off its "
                 "unsplit weights by up to"),
    Case("qwen3-sp-broken-relayout", "qwen3", sequence_parallel=True, break_relayout=True,
         refused="layer model.layers.0: its input re-layout dp1·tp2 -> dp1·tp2·seq differs "
                 "from the unsplit activation by up to"),
    Case("gpt_neox", "gpt_neox"),
    # multi-query fused query_key_value [q | k | v]: q split by heads, the one k and v
    # head whole on both ranks (gradients summed); saved under TP, resumed under DDP
    Case("falcon", "falcon", split=FALCON_SPLIT, attention="transformer.h.0.self_attention",
         checkpoint=True),
    Case("falcon-sp", "falcon", sequence_parallel=True),
    # new_decoder_architecture, 2 key/value groups of [q q | k | v]: a contiguous split
    Case("falcon-gqa", "falcon_gqa", split=FALCON_GQA_SPLIT,
         attention="transformer.h.0.self_attention", checkpoint=True),
    Case("whisper", "whisper"),
    # TP inside FSDP / DDP replicas: replicated k/v, per-head norms, in-place adds
    Case("gemma-dp2-zero3", "gemma", dp=2, zero=3),
    Case("qwen3-sp-dp2-zero2", "qwen3", sequence_parallel=True, dp=2, zero=2),
    Case("falcon-dp2", "falcon", dp=2),
    Case("falcon-dp2-zero3", "falcon", dp=2, zero=3),  # FSDP2 shards [q_r | k | v] again
    # ZeRO-1 pieces of [q_r | k | v]: saved once in the model's order, resumed under DDP
    Case("falcon-dp2-zero1", "falcon", dp=2, zero=1, checkpoint=True),
    Case("gpt2-sp-dp2-zero3", "gpt2", sequence_parallel=True, dp=2, zero=3),
    Case("phi3-dp2-zero3", "phi3", dp=2, zero=3),  # FSDP2 shards the rank-major rows again
    # ZeRO-1 pieces of rank-major rows: saved whole in the model's order, resumed under DDP
    Case("gpt2-dp2-zero1", "gpt2", dp=2, zero=1, checkpoint=True),
    Case("mixtral", "mixtral"),  # attention split; routed experts replicated
    Case("mixtral-sp", "mixtral", sequence_parallel=True,  # the router would see a chunk
         refused="but mlp.gate (MixtralTopKRouter) is not a normalization"),
    Case("deepseek_v3", "deepseek_v3"),  # MLA attention whole; dense/shared MLP split
]




def build(arch: str):
    loaded = load_model(spec(arch), micro_batch=1, seq_len=SEQ, device="cpu", seed=SEED)
    return zero_dropout(loaded.module), loaded.loss_fn


_GRAPHS: dict = {}  # arch -> its layer graph: built here, or by the ranks (`shared_graphs`)


def build_graph(arch: str):
    return load_layer_graph(spec(arch), micro_batch=2, seq_len=SEQ, dtype=torch.float32)


def graph_of(arch: str):
    if arch not in _GRAPHS:
        _GRAPHS[arch] = build_graph(arch)
    return _GRAPHS[arch]


def shared_graphs(rank: int, world_size: int, known: dict, archs: list[str]) -> dict:
    """{arch: layer graph} of `archs` on every rank: `known` ones as the parent handed
    them over, the others traced by the ranks in turn (rank r the r-th, (r + world)-th,
    ...) and gathered, instead of one after the other in the parent before any rank
    starts (13 traces, ~10 s of one core on this 2-core machine)."""
    import torch.distributed as dist

    missing = [a for a in dict.fromkeys(archs) if a not in known]
    mine = {arch: build_graph(arch) for arch in missing[rank::world_size]}
    gathered = [None] * world_size
    dist.all_gather_object(gathered, mine)
    return {**known, **{a: g for part in gathered for a, g in part.items()}}


def plan_of(case: Case, graph):
    return uniform_plan(len(graph.layers), global_batch=GLOBAL_BATCH, precision=Precision.FP32,
                        tp=TP, dp=case.dp, zero=case.zero,
                        sequence_parallel=case.sequence_parallel)


@functools.lru_cache(maxsize=None)
def batches_of(arch: str) -> list:
    return [(l.inputs, l.target) for l in
            (load_model(spec(arch), micro_batch=GLOBAL_BATCH, seq_len=SEQ, device="cpu",
                        seed=1000 + step) for step in range(STEPS))]


@functools.lru_cache(maxsize=None)
def reference(arch: str):
    model, loss_fn = build(arch)
    return train_one_device(model, loss_fn, batches_of(arch), optimizer_kwargs())


def _break_one_attention(real_apply_tp, how: str):
    """apply_tp, then break BROKEN_LAYER's attention's head count (see Case)."""
    def broken(module, layer, strategy, mesh, loss_parallel=False):
        real_apply_tp(module, layer, strategy, mesh, loss_parallel=loss_parallel)
        if layer.name == BROKEN_LAYER:
            attention = module.self_attn
            if how == "global":
                attention.num_heads *= strategy.tp
            else:  # one head of twice the size: same shapes, other numbers
                attention.head_dim *= attention.num_heads
                attention.num_heads = 1
    return broken


def _reversed_features(real_relayout):
    def broken(x, src, dst, meshes):
        return real_relayout(x, src, dst, meshes).flip(-1)
    return broken


def _apply(case: Case, plan, graph, batches):
    model, loss_fn = build(case.arch)
    return apply(model, plan, graph, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                 optimizer_kwargs=optimizer_kwargs(), example_inputs=batches[0][0],
                 tp_self_check=case.self_check)


def _resume_under_ddp(pm, case: Case, graph, batches, folder: str) -> dict:
    """Save `pm`, resume the checkpoint under DDP on the same ranks, one more step each."""
    path = save_checkpoint(pm, folder)
    ddp = uniform_plan(len(graph.layers), global_batch=GLOBAL_BATCH,
                       precision=Precision.FP32, dp=TP * case.dp)
    resumed = _apply(case, ddp, graph, batches)
    load_checkpoint(resumed, path)
    loaded = full_state_dict(resumed)
    inputs, target = batches[0]
    losses = [pm.train_step(inputs, target), resumed.train_step(inputs, target)]
    return {"loaded": loaded, "next_losses": losses, "next_tp": full_state_dict(pm),
            "next_ddp": full_state_dict(resumed)}


def _export_then_load(pm, case: Case, plan, graph, batches, folder: str) -> dict:
    """export_pretrained under this plan, load_pretrained into a fresh model under the
    same plan: its full state (the Hugging Face folder holds the model's layout)."""
    pm.export_pretrained(f"{folder}-hf")
    fresh = _apply(case, plan, graph, batches)
    fresh.load_pretrained(f"{folder}-hf")
    return full_state_dict(fresh)


def run_cases(rank: int, world_size: int, payload: tuple) -> dict:
    """Every entry (case, batches, checkpoint folder) of `payload`'s list on every rank,
    once the ranks hold each case's graph (`shared_graphs`); rank 0's results, with
    "graphs" {arch: graph}."""
    known, entries = payload
    graphs = shared_graphs(rank, world_size, known, [case.arch for case, *_ in entries])
    results = {"graphs": graphs}
    real_apply_tp, real_relayout = apply_module.apply_tp, layout_module.relayout
    real_model_order = FusedSplit.to_model_order
    for case, batches, folder in entries:
        graph = graphs[case.arch]
        plan = plan_of(case, graph)
        apply_module.apply_tp = (_break_one_attention(real_apply_tp, case.break_heads)
                                 if case.break_heads else real_apply_tp)
        if case.break_relayout:
            layout_module.relayout = _reversed_features(real_relayout)
        if case.break_fused_order:
            FusedSplit.to_model_order = lambda self, tensor, dim: tensor
        try:
            pm = _apply(case, plan, graph, batches)
        except PlannerError as exc:  # every rank reaches the same verdict: no hang
            results[case.name] = {"error": str(exc)}
            continue
        finally:
            apply_module.apply_tp, layout_module.relayout = real_apply_tp, real_relayout
            FusedSplit.to_model_order = real_model_order
        params = dict(pm.module.named_parameters())
        local = {name: params[name].to_local().clone() for name, _ in case.split}
        heads = head_counts(pm.module.get_submodule(case.attention)) if case.attention else {}
        losses = [pm.train_step(inputs, target) for inputs, target in batches]
        state = full_state_dict(pm)  # collective: every rank gathers, rank 0 reports
        load_full_state_dict(pm, state)
        again = full_state_dict(pm)
        results[case.name] = {"losses": losses, "state": state, "local": local,
                              "heads": heads, "reloaded": again}
        if case.checkpoint:
            results[case.name]["hf_loaded"] = _export_then_load(pm, case, plan, graph, batches,
                                                                folder)
            results[case.name].update(_resume_under_ddp(pm, case, graph, batches, folder))
    return results


@functools.lru_cache(maxsize=None)
def results(world: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:  # checkpoints, shared by the ranks
        entries = [(case, batches_of(case.arch), f"{folder}/{case.name}") for case in CASES
                   if TP * case.dp == world]
        known = {case.arch: _GRAPHS[case.arch] for case, *_ in entries if case.arch in _GRAPHS}
        got = spawn(run_cases, world, (known, entries), timeout_s=240)[0]
    for arch, graph in got.pop("graphs").items():  # the tests read the ranks' graphs too
        _GRAPHS.setdefault(arch, graph)
    return got


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_tp_matches_one_device_or_is_refused(case: Case):
    got = results(TP * case.dp)[case.name]
    if case.refused is not None:
        assert "error" in got, f"{case.name} ran; it should be refused ({case.refused})"
        assert case.refused in got["error"], got["error"]
        assert "\n" not in got["error"], f"not one line: {got['error']!r}"
        return
    assert "error" not in got, got.get("error")
    ref_losses, ref_state = reference(case.arch)
    if case.differs:
        worst = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref_losses))
        assert worst > RTOL, f"{case.name} matched one device; the break did nothing"
        return
    assert_matches_reference(got, ref_losses, ref_state)
    for name, tensor in got["reloaded"].items():  # full state -> shards -> full state
        assert torch.equal(tensor, got["state"][name]), name


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", [c for c in CASES if c.split], ids=lambda c: c.name)
def test_fused_projections_really_split(case: Case):
    got = results(TP * case.dp)[case.name]
    assert "error" not in got, got.get("error")
    whole = dict(build(case.arch)[0].named_parameters())  # the same seed's initial weights
    graph = graph_of(case.arch)
    for name, dim in case.split:
        module = name.rsplit(".", 1)[0]
        fused = next((c.fused for layer in graph.layers for c in layer.tp_candidates
                      if layer.name and f"{layer.name}.{c.module}" == module), ())
        parts = fused or (whole[name].shape[dim],)
        starts = [sum(parts[:k]) for k in range(len(parts))]
        # multi-query: the one key/value head is whole on every rank
        shared = fused_shared(parts, build(case.arch)[0].get_submodule(case.attention))
        held = [n if shared and shared[k] else n // TP for k, n in enumerate(parts)]
        # rank 0: the first half of each packed projection ([q_0 | k_0 | v_0]), all of a
        # shared one ([q_0 | k | v])
        expected = torch.cat([whole[name].narrow(dim, start, n)
                              for start, n in zip(starts, held)], dim=dim)
        local = got["local"][name]
        assert local.shape[dim] == sum(held), (name, tuple(local.shape))
        assert shared or local.shape[dim] * TP == whole[name].shape[dim], name
        assert torch.equal(local, expected.detach()), f"{name}: rank 0 holds other rows"
    global_heads = head_counts(build(case.arch)[0].get_submodule(case.attention))
    assert got["heads"]["heads"] * TP == global_heads["heads"], (got["heads"], global_heads)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", [c for c in CASES if c.checkpoint], ids=lambda c: c.name)
def test_fused_checkpoint_resumes_under_another_plan(case: Case):
    """Saved under TP (fused rows rank-major), loaded under DDP (model order)."""
    got = results(TP * case.dp)[case.name]
    assert "error" not in got, got.get("error")
    for name, tensor in got["state"].items():  # the model's own layout, exactly
        assert torch.equal(got["loaded"][name], tensor), name
        assert torch.equal(got["hf_loaded"][name], tensor), name  # export, load_pretrained
    tp_loss, ddp_loss = got["next_losses"]  # the optimizer state came back in order too
    assert abs(tp_loss - ddp_loss) <= RTOL * abs(tp_loss), got["next_losses"]
    for name, tensor in got["next_tp"].items():
        assert_params_match(name, got["next_ddp"][name], tensor)


# ----------------------------------------------------------------------------- candidates


def test_fused_rank_major_order_and_its_inverse():
    """Rank r's contiguous shard is its piece of every packed projection, in order."""
    split = FusedSplit(parts=(4, 2, 2), tp=2, dims=(("weight", 0),))
    rows = torch.arange(8.0)  # model order [q0 q1 q2 q3 | k0 k1 | v0 v1]
    assert split.to_rank_major(rows, 0).tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
    conv1d = torch.arange(24.0).view(3, 8)  # a Conv1D weight: output features on dim 1
    assert torch.equal(split.to_model_order(split.to_rank_major(conv1d, 1), 1), conv1d)
    assert split.to_rank_major(conv1d, 1)[:, :4].tolist() == conv1d[:, [0, 1, 4, 6]].tolist()


def test_shared_parts_are_stored_once_per_rank_and_saved_once():
    """Multi-query [q | k | v]: rank r stores [q_r | k | v]; the model's order (state
    dicts, DCP) and the checkpoint layout (load/export_pretrained) take rank 0's copy."""
    split = FusedSplit(parts=(4, 1, 1), tp=2, dims=(("weight", 0),), shared=(False, True, True))
    rows = torch.arange(6.0)  # model order [q0 q1 q2 q3 | k | v]
    stored = split.to_rank_major(rows, 0)
    assert stored.tolist() == [0, 1, 4, 5, 2, 3, 4, 5] and split.local_parts() == (2, 1, 1)
    assert torch.equal(split.to_model_order(stored, 0), rows)
    assert split.model_shape((8, 3), 0) == (6, 3)
    transform = FusedDim(split, 0)
    assert transform.checkpoint_index(torch.arange(8), 8).tolist() == stored.long().tolist()
    assert torch.equal(to_checkpoint_layout(stored, transform), rows)
    assert [(p.local, p.full) for p in shard_pieces(stored, transform)] == [
        ((slice(0, 2),), (slice(0, 2),)), ((slice(2, 4),), (slice(4, 6),)),
        ((slice(4, 8),), (slice(2, 6),))]  # rank 1's [q2 q3 | k | v]: one run
    with pytest.raises(PlannerError, match="does not describe a dim of 6"):
        split.model_shape((6, 3), 0)


def candidates(arch: str, layer: str) -> set[str]:
    return {str(c) for c in graph_of(arch).layer(layer).tp_candidates}


def test_candidates_follow_what_really_splits():
    """The IR offers only splits the executor runs right (pure logic, no ranks)."""
    # the model's own plan: MLA attention (q_a_proj, kv_b_proj, ...) is not in it
    assert candidates("deepseek_v3", "model.layers.0") == {
        "mlp.gate_proj:colwise", "mlp.up_proj:colwise", "mlp.down_proj:rowwise"}
    # packed MoE experts and the router stay whole; the attention splits
    assert candidates("mixtral", "model.layers.0") == {
        "self_attn.q_proj:colwise", "self_attn.k_proj:colwise", "self_attn.v_proj:colwise",
        "self_attn.o_proj:rowwise"}
    # fused [q|k|v] / [gate|up] projections split per part (Phi-3's own plan gathers them)
    assert candidates("phi3", "model.layers.0") == {
        "self_attn.qkv_proj:colwise[64|64|64]", "self_attn.o_proj:rowwise",
        "mlp.gate_up_proj:colwise[128|128]", "mlp.down_proj:rowwise"}
    assert "self_attn.qkv_proj:colwise[64|32|32]" in candidates("phi3_gqa", "model.layers.0")
    assert candidates("gpt2", "transformer.h.0") == {  # Conv1D modules
        "attn.c_attn:colwise[64|64|64]", "attn.c_proj:rowwise", "mlp.c_fc:colwise",
        "mlp.c_proj:rowwise"}
    # multi-query Falcon: fused [q|k|v] with one KV head, k and v whole on every rank,
    # so the degree divides the query part and heads only
    assert candidates("falcon", "transformer.h.0") == {
        "self_attention.query_key_value:colwise[64|16|16]", "self_attention.dense:rowwise",
        "mlp.dense_h_to_4h:colwise", "mlp.dense_4h_to_h:rowwise"}
    graph = graph_of("falcon")
    table = strategy_table(PlanDocument(uniform_plan(len(graph.layers), tp=2, global_batch=2),
                                        graph.model, cluster={}, **model_identity(graph)), graph)
    blocks = [line for line in table.splitlines() if "transformer.h.1" in line]
    assert blocks and "2*" not in blocks[0], table  # the blocks really split
    falcon = graph.layer("transformer.h.0")
    assert not any("part1" in what or "kv_heads" in what for what, _ in falcon.tp_divisors)
    assert falcon.tp_degree_allowed(4) and "heads=4" in falcon.tp_violation(8)
    # new_decoder_architecture: per key/value group, a contiguous split keeps whole groups
    assert candidates("falcon_gqa", "transformer.h.0") == {
        "self_attention.query_key_value:colwise", "self_attention.dense:rowwise",
        "mlp.dense_h_to_4h:colwise", "mlp.dense_4h_to_h:rowwise"}
    assert "kv_heads=2" in graph_of("falcon_gqa").layer("transformer.h.0").tp_violation(4)
    # GPT-NeoX's query_key_value is per-head [q_h k_h v_h]: its own plan splits it
    assert "attention.query_key_value:colwise" in candidates("gpt_neox", "gpt_neox.layers.0")
    # one KV head: k/v whole (not candidates), the degree divides the query heads only
    gemma = graph_of("gemma").layer("model.layers.0")
    assert "self_attn.k_proj:colwise" not in {str(c) for c in gemma.tp_candidates}
    assert "kv_heads" not in dict(gemma.tp_divisors)
    assert gemma.tp_degree_allowed(4) and "heads=4" in gemma.tp_violation(8)
    # T5: the attention takes a position bias with a row per global head
    assert candidates("t5", "encoder.block.1") == {
        "layer.1.DenseReluDense.wi:colwise", "layer.1.DenseReluDense.wo:rowwise"}
