"""The memory model on the lean host path (`ir.lean_host`, issue 15): the units it reads
off a meta-built model, the walk's lean terms summed by hand, and that the FSDP2 path is
priced as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models.activations import LayerActivations
from cost_models.clusters import get_cluster
from cost_models.common import layer_configs
from cost_models.memory import ChunkMemory, LayerMemory, _layer_memory, plan_memory, walk_rank
from cost_models.model_states import ModelStates
from cost_models.pipeline_ops import rank_ops
from cost_models.tied_memory import tied_shards
from ir.lean_host import (RING_PIECE_BYTES, LeanLayer, lean_layer, lean_layers,
                          ring_scratch_bytes)
from ir.plan import uniform_plan
from ir.strategy import Precision, Schedule
from planner import zoo
from planner.models import load_layer_graph, resolve_config

SPEC = "gpt:layers=2,hidden=64,heads=4,vocab=512,seq=32"


def _meta_gpt(spec: str = SPEC):
    family, config, _ = resolve_config(spec)
    with torch.device("meta"):
        return zoo.FAMILIES[family].build(config)


def _graph(spec: str = SPEC):
    return load_layer_graph(spec, micro_batch=1, seq_len=32, dtype=torch.float32)


# ---- the units, read off the model as executors.data_parallel makes them ------------------

def test_lean_units_of_a_gpt():
    graph, model = _graph(), _meta_gpt()
    embed, block, head = graph.layers[0], graph.layers[1], graph.layers[-1]
    zero3 = uniform_plan(1, dp=4, zero=3).layer_strategies[0]
    # tok and pos are units of their own: not gathered in backward, reduced in place;
    # tok (512 x 64) is the larger of the two (pos: 32 x 64)
    assert lean_layer(model.embed, embed, zero3) == LeanLayer(0.0, 0.0, 1.0, 512 / 544)
    # a block: one unit of many tensors, gathered for its backward, copied to reduce
    assert lean_layer(model.get_submodule(block.name), block, zero3) == \
        LeanLayer(1.0, 1.0, 1.0, 1.0)
    # the head copy: one tensor of 512 rows over 4 ranks, reduced in its own storage
    assert lean_layer(model.head, head, zero3) == LeanLayer(1.0, 0.0, 1.0, 1.0)


def test_uneven_rows_are_copied_and_vocab_tables_keep_a_whole_gradient():
    spec = "gpt:layers=2,hidden=64,heads=4,vocab=510,seq=32"
    graph, model = _graph(spec), _meta_gpt(spec)
    zero3 = uniform_plan(1, dp=4, zero=3).layer_strategies[0]
    head = lean_layer(model.head, graph.layers[-1], zero3)
    assert head.reduce_copy_share == 1.0  # 510 rows pad over 4 ranks: FSDP2 copies
    embed = lean_layer(model.embed, graph.layers[0], zero3)
    # tok (510 rows) pads, pos (32 rows) splits: the copied share is tok's
    assert embed.reduce_copy_share == pytest.approx(510 / (510 + 32))
    tp2 = uniform_plan(1, tp=2, dp=2, zero=3).layer_strategies[0]
    embed = lean_layer(model.embed, graph.layers[0], tp2)
    # tok's local gradient is half the rows of a whole-vocabulary one: 64 x (510 + 32)
    # held where the layer's local parameters are 64 x (255 + 32)
    assert embed.unsharded_grad_scale == pytest.approx((510 + 32) / (255 + 32))


def test_only_sharded_data_parallel_layers_take_the_lean_path():
    graph, model = _graph(), _meta_gpt()
    n = len(graph.layers)
    for plan, lean in [(uniform_plan(n, dp=4, zero=3), True), (uniform_plan(n, dp=4, zero=2), True),
                       (uniform_plan(n, dp=4, zero=1), False), (uniform_plan(n, dp=4), False),
                       (uniform_plan(n, tp=4), False)]:
        units = lean_layers(model, graph.layers, plan.layer_strategies)
        assert all((u is not None) is lean for u in units), plan


# ---- the walk's lean terms, summed by hand -----------------------------------------------

def _unit(**lean) -> LayerMemory:
    """A ZeRO-3 unit of 10 bytes of shard, copy, gradient and reduce input; no activations."""
    return LayerMemory(states=ModelStates(10, 10, 20), activations=LayerActivations(0.0, 0.0, 0.0),
                       gather_unit_bytes=10, unsharded_grad_bytes=10, step_tensor_params=(),
                       fp32_moment_bytes=0.0, working_param_bytes=10, reduce_bytes=10,
                       reshard_after_forward=True, **lean)


def _walk(layers):
    ops = rank_ops(Schedule.ONE_F_ONE_B, 1, 0, 1)
    return walk_rank([ChunkMemory(tuple(layers))], ops, stage=0, num_microbatches=1,
                     pipelined=False, overhead_bytes=0, optimizer="sgd", implementation="single")


def test_walk_prices_what_the_lean_executor_holds():
    # FSDP2's path, units A then B. B's backward: stored 20 + its copy 10, A prefetched
    # (10), B's new gradient 10, moments 40 = 90. A's backward: copy 10 again, B's stored
    # gradient 10 + A's new one 10, B's retained reduce input 10: 30 + 20 + 40 + 10 = 100;
    # A's reduction: 20 + (10 + 10 + 10) + 40 + its input 10 = 100.
    fsdp2 = _walk([_unit(), _unit()])
    assert fsdp2.peak_bytes == 100
    # lean: A an embedding unit (not gathered in backward, reduced in place), no
    # prefetch, no retained input. B's reduction: 20 + (10 + 10) + 40 + input 10 = 90;
    # A's backward 20 + 20 + 40 = 80; A's reduction 20 + 30 + 40 + 0 = 90.
    lean = dict(backward_prefetch=False, retains_reduce_input=False)
    embedding = _unit(backward_gather_bytes=0.0, reduce_input_bytes=0.0, **lean)
    walked = _walk([embedding, _unit(**lean)])
    assert walked.peak_bytes == 90 and walked.buffers == 10  # B's reduce input
    # each term alone: no prefetch only (A's backward still 30 + 20 + 40 + retained 10)
    assert _walk([_unit(backward_prefetch=False), _unit(backward_prefetch=False)]).peak_bytes == 100
    # no retained input only: A's backward 30 + 20 + 40 = 90, its reduction 20 + 30 + 40 + 10
    no_retain = _unit(retains_reduce_input=False)
    assert _walk([no_retain, no_retain]).peak_bytes == 100
    # and with A reduced in place as well: A's backward 90 is the peak
    in_place = _unit(retains_reduce_input=False, reduce_input_bytes=0.0)
    assert _walk([in_place, no_retain]).peak_bytes == 90


def test_the_ring_receives_into_a_scratch_of_at_most_a_piece():
    # executors.host_collectives.RingReduceScatter: `received` (min(piece, chunk)) lives
    # beside the unit's gradient, input and output while it reduces. B's reduction from
    # test_walk_prices_what_the_lean_executor_holds: 90, plus its scratch 3
    lean = dict(backward_prefetch=False, retains_reduce_input=False)
    embedding = _unit(backward_gather_bytes=0.0, reduce_input_bytes=0.0, **lean)
    walked = _walk([embedding, _unit(reduce_scratch_bytes=3.0, **lean)])
    assert walked.peak_bytes == 93 and walked.buffers == 13
    # the layer's figure: its largest unit's chunk (tok: 512 x 64 fp32 over 4 ranks),
    # and never more than a piece (a 1M-row table's chunk is 64 MiB)
    graph, model = _graph(), _meta_gpt()
    plan = uniform_plan(len(graph.layers), dp=4, zero=3, global_batch=4,
                        precision=Precision.FP32, optimizer="sgd")
    configs = layer_configs(graph, plan, "cpu", lean_layers(model, graph.layers,
                                                            plan.layer_strategies))
    embed = _layer_memory(graph, plan, 0, configs, None)
    assert embed.reduce_scratch_bytes == 512 * 64 * 4 / 4
    assert ring_scratch_bytes(2**20 * 64 * 4 / 4) == RING_PIECE_BYTES == 16 * 2**20


def test_unreduced_accumulation_keeps_the_whole_gradient_when_reduced_in_place():
    # with two micro-batches the first backward keeps its gradient unreduced: a unit
    # reduced in place still holds it (reduce_bytes), only its reduce copy-in is gone
    lean = _unit(reduce_input_bytes=0.0, retains_reduce_input=False, backward_prefetch=False)
    ops = rank_ops(Schedule.ONE_F_ONE_B, 1, 0, 2)
    one = walk_rank([ChunkMemory((lean,))], rank_ops(Schedule.ONE_F_ONE_B, 1, 0, 1), stage=0,
                    num_microbatches=1, pipelined=False, overhead_bytes=0, optimizer="sgd",
                    implementation="single")
    two = walk_rank([ChunkMemory((lean,))], ops, stage=0, num_microbatches=2, pipelined=False,
                    overhead_bytes=0, optimizer="sgd", implementation="single")
    assert two.peak_bytes == one.peak_bytes + 10


# ---- plans: the FSDP2 path unchanged, the lean one keyed in the caches ---------------------

def test_plans_without_lean_units_price_as_before():
    graph = _graph()
    plan = uniform_plan(len(graph.layers), dp=4, zero=3, global_batch=4, precision=Precision.FP32,
                        optimizer="sgd")
    cluster = get_cluster("local", gpus_per_node=4)
    default = plan_memory(graph, plan, cluster)
    assert plan_memory(graph, plan, cluster,
                       layer_configs(graph, plan, cluster.device, lean=None)) == default
    units = lean_layers(_meta_gpt(), graph.layers, plan.layer_strategies)
    lean = plan_memory(graph, plan, cluster, layer_configs(graph, plan, cluster.device, units))
    assert lean.peak_bytes < default.peak_bytes


def test_layer_cache_tells_lean_units_apart():
    graph = _graph()
    plan = uniform_plan(len(graph.layers), dp=4, zero=3, global_batch=4)
    cluster = get_cluster("local", gpus_per_node=4)
    units = lean_layers(_meta_gpt(), graph.layers, plan.layer_strategies)
    cache: dict = {}
    plain = layer_configs(graph, plan, cluster.device)
    lean = layer_configs(graph, plan, cluster.device, units)
    first = _layer_memory(graph, plan, 0, plain, cache)
    second = _layer_memory(graph, plan, 0, lean, cache)
    assert first.backward_gather_bytes is None and second.backward_gather_bytes == 0.0
    assert _layer_memory(graph, plan, 0, plain, cache) is first


def test_tied_copies_of_one_layout_sum_local_shards():
    # executors.tied.TiedGradients.sync sums the local shards when every copy's gradient
    # is a DTensor of one layout (one stage, one strategy), else full gradients
    graph = _graph()
    head = len(graph.layers) - 1
    mem = _layer_memory(graph, uniform_plan(len(graph.layers), dp=4, zero=3), head,
                        layer_configs(graph, uniform_plan(len(graph.layers), dp=4, zero=3),
                                      "cpu"), None)
    full = mem.tied_grad_bytes
    assert full > 0
    zero3 = uniform_plan(len(graph.layers), dp=4, zero=3)
    assert tied_shards(graph, zero3, head, mem).tied_grad_bytes == full / 4
    ddp = uniform_plan(len(graph.layers), dp=4)  # replicated gradients: whole local
    assert tied_shards(graph, ddp, head, mem).tied_grad_bytes == full
    strategies = list(zero3.layer_strategies)
    strategies[head] = ddp.layer_strategies[head]  # copies of two layouts: full
    mixed = dataclasses.replace(zero3, layer_strategies=tuple(strategies))
    assert tied_shards(graph, mixed, head, mem).tied_grad_bytes == full


def test_only_a_meta_built_model_on_the_host_is_priced_lean():
    from cost_models.common import model_layer_configs

    graph = _graph()
    plan = uniform_plan(len(graph.layers), dp=4, zero=3, global_batch=4)
    family, config, _ = resolve_config(SPEC)
    built = zoo.FAMILIES[family].build(config)  # on the CPU: FSDP2's own path
    assert all(c.lean is None for c in model_layer_configs(graph, plan, "cpu", built))
    assert all(c.lean is None for c in model_layer_configs(graph, plan, "h100", _meta_gpt()))
    lean = model_layer_configs(graph, plan, "cpu", _meta_gpt())
    assert lean[0].lean == LeanLayer(0.0, 0.0, 1.0, 512 / 544)
    assert lean[1].lean == LeanLayer(1.0, 1.0, 1.0, 1.0)
