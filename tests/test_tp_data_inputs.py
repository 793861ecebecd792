"""A column-parallel module fed the model's data reduces no input gradient: the estimate
prices the TP collectives the executor runs, counted on 2 gloo ranks (review of issue 17).

The model: 3 blocks `x + mlp(x)`, mlp = fc1 (32 -> 128, colwise), GELU, fc2 (128 -> 32,
rowwise), on float data x (4, 8, 32) that requires no grad (`ir.stand_in.is_data`), TP 2,
fp32, one micro-batch. blocks.0's fc1 reads the data: autograd records no backward for
the collective that brings its input in, so none runs.
  TP:      forward: one all-reduce per fc2 (3); backward: one per fc1 input gradient but
           blocks.0's (2). 5 all-reduces.
  TP + SP: forward: per block an all-gather of mlp's input (the executor's gather hook)
           and a reduce-scatter of fc2's output (3 + 3); backward: the all-gather of each
           fc2 output's gradient (3) and the reduce-scatter of each mlp input's gradient
           but blocks.0's (2). 6 all-gathers, 5 reduce-scatters.
torch.profiler counted exactly these `_c10d_functional` calls in one step (2026-11-25);
the estimate's per-layer TP seconds (`comm.tp_comm_s`), on a spec whose collectives cost
distinct round figures and no bytes, decode to the same counts.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from cost_models.comm import tp_comm_s
from cost_models.common import StepConfig
from ir.calibration_tables import CalibrationTables
from ir.cluster import CollectiveFit
from ir.measure import build_layer_graph
from ir.plan import uniform_plan
from ir.strategy import LayerStrategy, Precision

from dist_utils import spawn
from tests.cpu_specs import two_ranks_on_two_cores

pytestmark = [pytest.mark.multiprocess]

SHAPE = (4, 8, 32)  # batch, sequence, hidden
# 2 ranks, ring: all-reduce 2 alpha, all-gather and reduce-scatter alpha each (4 KB at
# 1 GB/s adds microseconds: the counts decode by place value)
ALPHA_S = {"all_reduce": 0.5, "all_gather": 1e3, "reduce_scatter": 1e6}
FUNCTIONAL = {"all_reduce": "_c10d_functional::all_reduce",
              "all_gather": "_c10d_functional::all_gather_into_tensor",
              "reduce_scatter": "_c10d_functional::reduce_scatter_tensor"}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = MLP()

    def forward(self, x):
        return x + self.mlp(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

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


def count_step(rank: int, world_size: int, payload) -> dict:
    """The `_c10d_functional` collectives of one train_step (after a warm-up step)."""
    from torch.profiler import ProfilerActivity, profile

    from executors import apply

    graph_, plan = payload
    pm = apply(build(), plan, graph_, loss_fn=mse, optimizer=torch.optim.SGD,
               optimizer_kwargs={"lr": 0.0})
    x, target = torch.randn(SHAPE), torch.randn(SHAPE)
    pm.train_step({"x": x}, target)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        pm.train_step({"x": x}, target)
    counts = {e.key: e.count for e in prof.key_averages()}
    return {c: counts.get(key, 0) for c, key in FUNCTIONAL.items()}


def priced_counts(sequence_parallel: bool) -> dict:
    """The estimate's TP collectives of one micro-batch, decoded from its seconds."""
    fits = tuple(CollectiveFit(c, "intra_node", alpha, 1e9, 2) for c, alpha in ALPHA_S.items())
    cluster = two_ranks_on_two_cores(CalibrationTables(collective_fits=fits))
    config = StepConfig(micro_batch=SHAPE[0], graph_micro_batch=SHAPE[0],
                        graph_dtype="float32", precision=Precision.FP32, device_type="cpu")
    strategy = LayerStrategy(tp=2, sequence_parallel=sequence_parallel)
    total = sum(sum(tp_comm_s(layer, strategy, cluster, config)) for layer in graph().layers)
    return {"reduce_scatter": int(total // ALPHA_S["reduce_scatter"]),
            "all_gather": int(total % ALPHA_S["reduce_scatter"] // ALPHA_S["all_gather"]),
            "all_reduce": round(total % ALPHA_S["all_gather"] / (2 * ALPHA_S["all_reduce"]))}


def test_only_the_first_blocks_fc1_reads_the_data():
    assert [layer.gradless_tp_inputs for layer in graph().layers] == [("mlp.fc1",), (), ()]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sequence_parallel,expected", [
    (False, {"all_reduce": 5, "all_gather": 0, "reduce_scatter": 0}),
    (True, {"all_reduce": 0, "all_gather": 6, "reduce_scatter": 5})], ids=["tp", "tp-sp"])
def test_the_estimate_prices_the_collectives_the_executor_runs(sequence_parallel, expected):
    plan = uniform_plan(len(graph().layers), tp=2, sequence_parallel=sequence_parallel,
                        micro_batch=SHAPE[0], global_batch=SHAPE[0], precision=Precision.FP32)
    ran = spawn(count_step, 2, (graph(), plan), timeout_s=200)
    assert ran[0] == ran[1] == expected
    assert priced_counts(sequence_parallel) == expected
