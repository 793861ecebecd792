"""A pipeline cut that no gradient crosses: no gradient is sent back over it, and the
estimate and the search price none (review of issue 17).

The model: 4 blocks of one class on float data (4, 4, 32) that requires no grad; blocks.0
holds a Linear it does not use and runs only parameter-free ops on the data (4 x tanh of
x @ a buffer), blocks 1-3 run x + relu(fc(x)). blocks.0's output carries no gradient
(`ir.stand_in.is_data`), so the cut after it is a gradless cut point (`LayerGraph.
gradless_cuts`); blocks.1's output does, so the cut after it is not.

On 2 gloo ranks, pp 2, GPipe, 4 micro-batches, torch.profiler counted per step
(2026-11-25, torch 2.13): cut after blocks.0, rank 0 sends 4 activations and receives
nothing, rank 1 receives 4 and sends nothing (PipelineStage gives the received
activation the sender's requires_grad: False, so stage 1 computes no input gradient);
cut after blocks.1, 4 sends and 4 receives on each rank (the activations, then their
gradients). The estimate used to price a gradient send back over both cuts.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from cost_models.estimate import estimate
from ir.measure import build_layer_graph
from ir.plan import uniform_plan
from ir.strategy import Precision, Schedule
from planner import search as S
from planner.search_space import SearchOptions

from dist_utils import spawn
from test_search import _composed_s, _cpu_kit_cluster

SHAPE = (4, 4, 32)  # batch, sequence, features
GLOBAL_BATCH = 4
TANH_ROUNDS = 4  # blocks.0's forward work: about the other three blocks' forward + backward


class Block(nn.Module):
    def __init__(self, skip: bool = False):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.skip = skip
        self.register_buffer("mix", torch.eye(32) * 0.5)

    def forward(self, x):
        if self.skip:  # parameter-free work on the data: its output carries no gradient
            for _ in range(TANH_ROUNDS):
                x = torch.tanh(x @ self.mix)
            return x
        return x + torch.relu(self.fc(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(skip=True)] + [Block() for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def mse(out, target):
    return ((out - target) ** 2).mean()


def build() -> Model:
    torch.manual_seed(0)
    return Model()


@functools.lru_cache(maxsize=None)
def graph():
    return build_layer_graph(build(), {"x": torch.randn(SHAPE)}, torch.randn(SHAPE), mse,
                             dtype=torch.float32, seq_len=SHAPE[1])


def plan_cut_after(layer: int):
    return uniform_plan(len(graph().layers), pp=2, micro_batch=1, global_batch=GLOBAL_BATCH,
                        precision=Precision.FP32, schedule=Schedule.GPIPE,
                        stage_boundaries=(layer + 1,))


def count_p2p(rank: int, world_size: int, payload) -> dict:
    """p2p sends and receives of one train_step (after a warm-up step)."""
    from torch.profiler import ProfilerActivity, profile

    from executors import apply

    graph_, plan = payload
    pm = apply(build(), plan, graph_, loss_fn=mse, optimizer=torch.optim.SGD,
               optimizer_kwargs={"lr": 0.1})
    x, target = torch.randn(SHAPE), torch.randn(SHAPE)
    pm.train_step({"x": x}, target)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pm.train_step({"x": x}, target)
    counts = {e.key: e.count for e in prof.key_averages()}
    return {"send": counts.get("c10d::send", 0), "recv": counts.get("c10d::recv_", 0)}


def test_only_the_cut_after_the_parameter_free_block_is_gradless():
    g = graph()
    assert [layer.name for layer in g.layers] == [f"blocks.{i}" for i in range(4)]
    assert g.cut_points == (0, 1, 2) and g.gradless_cuts == (0,)
    assert (g.carries_gradient(0), g.carries_gradient(1)) == (False, True)
    # blocks.1 makes no gradient for its input (the IR's measured backward: weight only)
    assert g.layers[1].gradless_input_bytes == g.layers[1].input_bytes


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("cut,expected", [
    (0, [{"send": 4, "recv": 0}, {"send": 0, "recv": 4}]),
    (1, [{"send": 4, "recv": 4}, {"send": 4, "recv": 4}])], ids=["gradless", "gradient"])
def test_the_executor_sends_a_gradient_back_only_over_a_cut_that_carries_one(cut, expected):
    assert spawn(count_p2p, 2, (graph(), plan_cut_after(cut)), timeout_s=200) == expected


def test_the_estimate_prices_no_gradient_send_back_over_a_gradless_cut():
    cluster = _cpu_kit_cluster(2)
    gradless = estimate(graph(), plan_cut_after(0), cluster).stage_times
    carrying = estimate(graph(), plan_cut_after(1), cluster).stage_times
    assert gradless[0].pp_forward_s > 0 and gradless[1].pp_backward_s == 0.0
    assert carrying[1].pp_backward_s == pytest.approx(carrying[0].pp_forward_s)
    assert carrying[1].pp_backward_s > 0


def test_the_search_prices_each_cut_as_the_estimate_does():
    """Every candidate's DP objective is its estimate's stage times composed
    (test_search's `_composed_s`); the gradless cut is among the cuts chosen."""
    options = SearchOptions(pp=2, schedule=Schedule.GPIPE, no_checkpoint=True,
                            no_offload=True, precision=Precision.FP32, zero=0)
    result = S.search(graph(), _cpu_kit_cluster(2), GLOBAL_BATCH, options)
    assert any(c.plan.stages[0].last_layer == 0 for c in result.candidates)
    for c in result.candidates:
        composed_s = _composed_s(c.estimate, c.plan.num_microbatches)
        assert c.objective_s == pytest.approx(composed_s, rel=1e-12), str(c.plan)
