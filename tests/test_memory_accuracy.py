"""The memory model against what the executor really holds: tied copies, FSDP2 units,
pipeline schedules (the tracker that measures them: test_memory_tracker.py)."""

from __future__ import annotations

import pytest
import torch

from planner.models import load_layer_graph, load_model


# ---- the IR records tied copies as the executor makes them ----------------------------------

@pytest.mark.parametrize("spec, copies", [
    ("gpt-tiny", {"head": ("head.weight",)}),
    ("t5-tiny", {"decoder_embed": ("decoder_embed.tok.weight",), "head": ("head.weight",)}),
    ("llama-tiny", {}),
])
def test_ir_records_the_tied_copies_the_executor_makes(spec, copies):
    from executors.tied import find_tie_groups

    graph = load_layer_graph(spec, micro_batch=1, dtype=torch.float32)
    module = load_model(spec, device="meta").module
    recorded = {l.name: l.tied_param_names for l in graph.layers if l.tied_params}
    assert recorded == copies
    # executors.tied.untie gives every layer of a tie group after the first its own copy
    groups = find_tie_groups(module, graph)
    made = {graph.layers[j].name: names for g in groups
            for j, names in zip(g.layers[1:], g.names[1:])}
    assert made == copies
    for name in copies:
        layer = graph.layer(name)
        size = module.get_parameter(layer.tied_param_names[0]).numel()
        assert layer.tied_params == size
        assert layer.tied_tp_params == size  # the copy sits in the layer's TP candidate
        assert layer.max_param_numel >= size
    # the owner still counts the parameter once: the IR's total is the model's
    assert sum(l.params for l in graph.layers) == graph.num_params


# ---- pipeline pass orders are torch.distributed.pipelining's --------------------------------

def test_pass_orders_match_torch_pipelining():
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    from cost_models.pipeline_ops import rank_ops
    from ir.strategy import Schedule

    for p, v, m in [(2, 2, 2), (2, 2, 4), (4, 2, 8), (3, 3, 6), (4, 2, 4)]:
        rounds = max(1, m // p)
        fake = SimpleNamespace(n_local_stages=v, microbatches_per_round=m // rounds,
                               pp_group_size=p, _n_microbatches=m)
        for r in range(p):
            torch_ops = ScheduleInterleaved1F1B._calculate_single_rank_operations(fake, r)
            want = [(a.computation_type == _ComputationType.FORWARD, (a.stage_index - r) // p,
                     a.microbatch_index) for a in torch_ops if a is not None]
            got = [(o.forward, o.chunk, o.microbatch)
                   for o in rank_ops(Schedule.INTERLEAVED, p, r, m, v)]
            assert got == want, (p, v, m, r)
    # 1F1B: the first rank runs p warm-up forwards (Schedule1F1B), the last one
    ops = [str(o) for o in rank_ops(Schedule.ONE_F_ONE_B, 2, 0, 4)]
    assert ops == ["F0.0", "F0.1", "B0.0", "F0.2", "B0.1", "F0.3", "B0.2", "B0.3"]
    assert [str(o) for o in rank_ops(Schedule.ONE_F_ONE_B, 2, 1, 2)] == \
        ["F0.0", "B0.0", "F0.1", "B0.1"]
    # no pipeline: the executor's loop, forward then backward per micro-batch
    assert [str(o) for o in rank_ops(Schedule.ONE_F_ONE_B, 1, 0, 2)] == \
        ["F0.0", "B0.0", "F0.1", "B0.1"]


# ---- FSDP2 units in the step walk -------------------------------------------------------------

def _unit(kept=100.0, weights=10.0, zero3=False):
    """A hand-made layer: a DP unit whose stored shard, gathered copy, gradient and
    reduce-scatter input are all `weights` bytes (dp = 1 sizes keep the sums plain)."""
    from cost_models.activations import LayerActivations
    from cost_models.memory import LayerMemory
    from cost_models.model_states import ModelStates

    return LayerMemory(states=ModelStates(weights, weights, 2 * weights),
                       activations=LayerActivations(kept, 0.0, 0.0),
                       gather_unit_bytes=weights if zero3 else 0.0,
                       unsharded_grad_bytes=weights, step_tensor_params=(),
                       fp32_moment_bytes=0.0, working_param_bytes=weights,
                       reduce_bytes=weights, reshard_after_forward=zero3)


def _walk(layers, *, m=1, pp=1, rank=0):
    from cost_models.memory import ChunkMemory, walk_rank
    from cost_models.pipeline_ops import rank_ops
    from ir.strategy import Schedule

    ops = rank_ops(Schedule.ONE_F_ONE_B, pp, rank, m)
    return walk_rank([ChunkMemory(tuple(layers))], ops, stage=rank, num_microbatches=m,
                     pipelined=pp > 1, overhead_bytes=0, optimizer="sgd", implementation="single")


def test_walk_holds_replicate_copies_until_each_layer_backward():
    # forward gathers both copies; the last layer's backward starts with everything:
    # stored 20 + copies 20, its new gradient 10, moments 40, activations 200
    peak = _walk([_unit(), _unit()])
    assert (peak.params, peak.grads, peak.optimizer, peak.activations) == (40, 10, 40, 200)
    assert peak.peak_bytes == 290 and peak.phase == "backward"


def test_walk_gathers_zero3_units_per_use():
    # ZeRO-3 frees each copy after forward and gathers it again in backward, with the
    # next unit prefetched (a buffer): the peak holds one copy, not two
    peak = _walk([_unit(zero3=True), _unit(zero3=True)])
    assert peak.params == 20 + 10 and peak.buffers == 10 and peak.peak_bytes == 290


def test_walk_accumulates_unreduced_gradients_and_reduces_last():
    # two micro-batches, no pipeline: the first backward keeps its unreduced gradient
    # (FSDP2 no-sync), the second reduces; copies are gathered again for micro-batch 2
    one, two = _walk([_unit(), _unit()]), _walk([_unit(), _unit()], m=2)
    assert two.peak_bytes == one.peak_bytes + 20  # both layers' unreduced gradients
    # a pipeline keeps the copies through all micro-batches and reduces at the end
    piped = _walk([_unit(), _unit()], m=2, pp=2, rank=0)
    assert piped.microbatches_in_flight == 2
    assert piped.peak_bytes == 40 + 10 + 40 + 400  # both micro-batches in flight




def _plain(kept, recompute, grad_flow, share, weights):
    """A hand-made layer without a DP unit whose backward was measured (share < 1)."""
    from cost_models.activations import LayerActivations
    from cost_models.memory import LayerMemory
    from cost_models.model_states import ModelStates

    return LayerMemory(states=ModelStates(weights, weights, 2 * weights),
                       activations=LayerActivations(kept, recompute, grad_flow, share),
                       gather_unit_bytes=0.0, unsharded_grad_bytes=0.0,
                       step_tensor_params=(), fp32_moment_bytes=0.0)


def test_walk_prices_a_measured_backward_at_its_peak_and_its_end():
    # Peak: weights 10 + its share of the new gradient 0.2 x 10 + moments 20 + all kept
    # 100 + transients (30 measured + 5 flowing) = 167, not the bound's whole gradient
    # (175). End: the whole gradient 10, its kept activations freed: 10+10+20+0+5 = 45.
    peak = _walk([_plain(kept=100.0, recompute=30.0, grad_flow=5.0, share=0.2, weights=10.0)])
    assert peak.peak_bytes == 167 and (peak.grads, peak.activations, peak.buffers) == (2, 100, 35)
    # A big gradient, few activations: the end is the peak, its 10 kept bytes gone
    # (100 + 100 + 200 + 0 + 5; the bound held them too: 415).
    end = _walk([_plain(kept=10.0, recompute=0.0, grad_flow=5.0, share=0.0, weights=100.0)])
    assert end.peak_bytes == 405 and end.activations == 0 and end.phase == "backward"


# ---- ZeRO-1 shards one flat buffer evenly ----------------------------------------------------

def test_zero1_ranks_hold_even_shards():
    from cost_models.clusters import get_cluster
    from cost_models.memory import plan_memory
    from ir.plan import uniform_plan
    from ir.strategy import Precision

    # executors.zero1: every rank of the group owns ceil(Ψ/dp) elements of the flat buffer,
    # so no DP rank is more loaded than another
    graph = load_layer_graph("gpt-tiny", micro_batch=1, dtype=torch.float32)
    plan = uniform_plan(len(graph.layers), dp=2, zero=1, global_batch=2,
                        precision=Precision.FP32)
    stage = plan_memory(graph, plan, get_cluster("local", gpus_per_node=2)).stages[0]
    assert stage.device_peak_bytes == ()


def test_held_through_step_is_what_the_walk_keeps():
    from cost_models.memory import held_through_step

    replicate, zero3 = _unit(), _unit(zero3=True)
    assert held_through_step(replicate, num_microbatches=1, pipelined=False) == 10  # copy
    assert held_through_step(zero3, num_microbatches=1, pipelined=False) == 0
    assert held_through_step(zero3, num_microbatches=4, pipelined=False) == 10  # unreduced
    assert held_through_step(zero3, num_microbatches=4, pipelined=True) == 20
