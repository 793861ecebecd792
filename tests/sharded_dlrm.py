"""Shared by the sharded-embedding tests: a small dropout-free DLRM, the placements under
test, the run on gloo ranks, and the single-process reference written independently
(plain nn.EmbeddingBag(sparse=True), torch optimizers, a row-wise Adagrad in ten lines)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from executors.hybrid_step import HybridTrainer
from executors.sharded_embedding import ShardedEmbedding, apply_table_placements
from executors.sparse_optimizer import SparseOptimizerSpec, SparseRowOptimizer
from ir.embedding_tables import (TablePlacement, TableSharding as K, dlrm_table_bound,
                                 init_table_rows)
from planner.zoo import dlrm
from planner.zoo.criteo_data import CriteoSynthetic

CONFIG = dlrm.Config(num_tables=5, rows_per_table=64, embedding_dim=8, bottom_mlp=(16,),
                     top_mlp=(16,), lookups_per_table=3)
GLOBAL_BATCH = 16  # divides over 2 and 4 ranks
STEPS = 3
NODE_SIZE = 2  # ranks per node for table_row_wise (two "nodes" at 4 ranks)
INIT_SEED = 7
DATA = CriteoSynthetic(rows_per_table=(CONFIG.rows_per_table,) * CONFIG.num_tables,
                       lookups_per_table=CONFIG.lookups_per_table, seed=3)
LR = {"sgd": 0.5, "rowwise_adagrad": 0.1, "adam": 0.01}  # big enough to move every row
ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which dense_optimizer keeps
# The clipped runs' max_norm per step: the reference's norms are 3.3 at step 0 and 0.4-3.9
# after (asserted in tests/test_sharded_embedding.py): steps 0 and 2 clip by more than
# 4x, step 1 runs under the norm (coefficient 1).
CLIP_MAX_NORMS = (0.5, 10.0, 0.05)


def adam_travel_bound(lr: float, steps: int, betas: tuple[float, float] = ADAM_BETAS) -> float:
    """How far Adam can move any one element in `steps` steps: the sum over t of
    lr * max|m_hat_t / sqrt(v_hat_t)|, bounded by Cauchy-Schwarz on the bias-corrected
    moments: (1-b1)/sqrt(1-b2) * sqrt(1-b2^t)/(1-b1^t) * sqrt(sum_k b1^(2(t-k)) / b2^(t-k)),
    1.0, 1.0014, 1.0036 at t = 1..3 (Kingma & Ba 2015 sec. 2.1 bound |update| the same
    way, without bias correction; eps only shrinks it). Whatever the gradient's size an
    element moves up to lr a step, so a parameter can pass through values ~lr away from
    where it ends, and the 2-rank run's rounding (another summation order) is relative to
    those: measured here, top_mlp.2.bias went 2.0e-2, 9.6e-3, 8.3e-5 over the 3 steps and
    differs from one process by 9.3e-10, one ulp of 9.6e-3 (1.1e-5 of its end value)."""
    b1, b2 = betas
    return sum(lr * (1 - b1) / math.sqrt(1 - b2) * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
               * math.sqrt(sum(b1 ** (2 * (t - k)) / b2 ** (t - k) for k in range(1, t + 1)))
               for t in range(1, steps + 1))


def names() -> list[str]:
    return [f"tables.{i}" for i in range(CONFIG.num_tables)]


def placements(kind: str, world: int) -> list[TablePlacement]:
    everyone = tuple(range(world))
    t = names()
    if kind == "table_wise":
        return [TablePlacement(n, K.TABLE_WISE, (i % world,)) for i, n in enumerate(t)]
    if kind in ("row_range", "row_hash", "column_wise"):
        return [TablePlacement(n, K(kind), everyone) for n in t]
    if kind == "table_row_wise":
        nodes = max(1, world // NODE_SIZE)
        return [TablePlacement(n, K.TABLE_ROW_WISE,
                               tuple(range((i % nodes) * NODE_SIZE, (i % nodes + 1) * NODE_SIZE)))
                for i, n in enumerate(t)]
    assert kind == "mixed"
    backwards = everyone[::-1]
    return [TablePlacement(t[0], K.REPLICATED, everyone),
            TablePlacement(t[1], K.TABLE_WISE, (world - 1,)),
            TablePlacement(t[2], K.ROW_RANGE, backwards),
            TablePlacement(t[3], K.ROW_HASH, backwards[:2]),
            TablePlacement(t[4], K.COLUMN_WISE, backwards)]


def table_init(table, rows, col_start, col_stop):
    return init_table_rows(table.name, INIT_SEED, rows, col_start, col_stop, table.dim,
                           dlrm_table_bound(table.rows))


def build_model() -> dlrm.DLRM:
    """The same dense values on every process (seeded), tables from the row initializer."""
    torch.manual_seed(0)
    model = dlrm.build(CONFIG)
    with torch.no_grad():
        for name, module in model.tables.items():
            module.weight.copy_(table_init(_table(f"tables.{name}"), torch.arange(
                CONFIG.rows_per_table), 0, CONFIG.embedding_dim))
    return model


def _table(name):
    from ir.embedding_tables import EmbeddingTable
    return EmbeddingTable(name, CONFIG.rows_per_table, CONFIG.embedding_dim, "float32", "sum", 1)


def dense_optimizer(kind: str, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR[kind])
    if kind == "rowwise_adagrad":
        return torch.optim.Adagrad(params, lr=LR[kind])
    return torch.optim.Adam(params, lr=LR[kind])


# ------------------------------------------------------------------ the reference


def reference_run(kind: str, max_norms: tuple[float, ...] | None = None) -> dict:
    """One process, the global batch, unsharded tables with sparse gradients; with
    `max_norms` (one per step) each step first clips as torch's clip_grad_norm_ does on
    the model whose tables have DENSE gradients (`clip_dense_reference`)."""
    model = build_model()
    for module in model.tables.values():
        module.sparse = True
    table_params = [m.weight for m in model.tables.values()]
    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    dense_opt = dense_optimizer(kind, dense)
    table_opt = None
    sum_sq = {id(p): torch.zeros(p.shape[0]) for p in table_params}
    if kind == "sgd":
        table_opt = torch.optim.SGD(table_params, lr=LR[kind])
    elif kind == "adam":
        table_opt = torch.optim.SparseAdam(table_params, lr=LR[kind])
    losses, grads, norms = [], [], []
    for step in range(STEPS):
        inputs, clicks = DATA.batch(step, GLOBAL_BATCH)
        dense_opt.zero_grad()
        for p in table_params:
            p.grad = None
        loss = dlrm.loss_fn(model(**inputs), clicks)
        loss.backward()
        if max_norms is not None:
            norms.append(clip_dense_reference(model, table_params, max_norms[step]))
        grads.append(dense_grads(model))
        dense_opt.step()
        if table_opt is not None:
            table_opt.step()
        else:  # row-wise Adagrad (FBGEMM): one accumulator per row, mean of g^2 over dim
            with torch.no_grad():
                for p in table_params:
                    g = p.grad.coalesce()
                    rows, values = g.indices()[0], g.values()
                    sum_sq[id(p)][rows] += values.pow(2).mean(dim=1)
                    p[rows] -= LR[kind] * values / (sum_sq[id(p)][rows].sqrt() + 1e-8)[:, None]
        losses.append(loss.item())
    state = {}
    for name, module in model.tables.items():
        p = module.weight
        if kind == "adam":
            state[f"tables.{name}"] = {k: table_opt.state[p][k] for k in ("exp_avg", "exp_avg_sq")}
        elif kind == "rowwise_adagrad":
            state[f"tables.{name}"] = {"sum_sq": sum_sq[id(p)]}
    # Adam: a dense parameter is compared on the scale it travelled (adam_travel_bound)
    travel = adam_travel_bound(LR[kind], STEPS) if kind == "adam" else 0.0
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "state": state, "grads": grads, "dense_travel": travel, "norms": norms}


def clip_dense_reference(model, table_params: list, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) with every table's
    gradient made dense (nn.EmbeddingBag without sparse: duplicate ids summed); the
    tables' sparse gradients, which the optimizers read, then times the same coefficient
    (torch's: min(1, max_norm / (norm + 1e-6))). Returns the norm before the clip."""
    sparse = {id(p): p.grad for p in table_params}
    for p in table_params:
        p.grad = p.grad.to_dense()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    coefficient = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in table_params:
        p.grad = sparse[id(p)] * coefficient
    return float(norm)


def dense_grads(model) -> dict[str, torch.Tensor]:
    """The dense parameters' gradients now, whole (a DTensor's gathered: a collective)."""
    from torch.distributed.tensor import DTensor
    return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.detach().clone())
            for n, p in model.named_parameters() if not n.startswith("tables.")}


# ------------------------------------------------------------------ the sharded run


def shard_report(tables, opt) -> dict:
    """Each table's shard on this rank: rows it holds, columns, values and optimizer state."""
    out = {}
    for name, module in tables.modules.items():
        if isinstance(module, ShardedEmbedding):
            shard = module.shard
            if shard is None:
                continue
            rows = module.local_ids if module.local_ids is not None else \
                torch.arange(shard.row_start, shard.row_stop)
            cols = (shard.col_start, shard.col_stop)
        else:
            rows, cols = torch.arange(module.weight.shape[0]), (0, module.weight.shape[1])
        state = {k: v.clone() for k, v in opt.state[name].items() if k != "step"}
        out[name] = (rows, cols, module.weight.detach().clone(), state)
    return out


def make_trainer(kind: str, placement_kind: str, rank: int, world: int, meta_tables: bool,
                 max_grad_norm: float | None = None):
    model = build_model()
    if meta_tables:  # the shard-by-shard build: no rank ever holds a whole table
        for module in model.tables.values():
            module.to("meta")
    tables = apply_table_placements(model, placements(placement_kind, world),
                                    node_size=NODE_SIZE, init=table_init)
    opt = SparseRowOptimizer(tables, SparseOptimizerSpec(kind, lr=LR[kind]))
    trainer = HybridTrainer(model, tables, dense_optimizer(kind, tables.dense_parameters(model)),
                            opt, dlrm.loss_fn, max_grad_norm=max_grad_norm)
    return model, tables, opt, trainer


def untouched_rows_kept(before: dict, after: dict, looked_up: dict[str, torch.Tensor]) -> int:
    """Rows nobody looked up this step: values and state bit-identical. Raises otherwise;
    returns how many rows were checked."""
    checked = 0
    for name, (rows, _, weight, state) in after.items():
        _, _, old_weight, old_state = before[name]
        untouched = ~torch.isin(rows, looked_up[name])
        assert torch.equal(weight[untouched], old_weight[untouched]), name
        for key in state:
            assert torch.equal(state[key][untouched], old_state[key][untouched]), (name, key)
        touched = ~untouched
        if touched.any() and state:  # the touched rows' state did move
            assert all(not torch.equal(state[k][touched], old_state[k][touched]) for k in state)
        checked += int(untouched.sum())
    return checked


def sharded_worker(rank: int, world: int, runs: list[tuple[str, str]],
                   max_norms: tuple[float, ...] | None = None) -> dict:
    """Each (placement, optimizer) of `runs` for STEPS steps; with `max_norms` (one per
    step) the trainer clips to them, and each step's `last_grad_norm` is kept."""
    results = {}
    for placement_kind, kind in runs:
        model, tables, opt, trainer = make_trainer(
            kind, placement_kind, rank, world, meta_tables=placement_kind != "table_wise",
            max_grad_norm=max_norms[0] if max_norms else None)
        losses, grads, norms, untouched, calls = [], [], [], 0, [0]
        real = dist.all_to_all_single

        def counted(*args, **kwargs):  # the steps' all-to-alls, every table's together
            calls[0] += 1
            return real(*args, **kwargs)

        for step in range(STEPS):
            inputs, clicks = DATA.batch(step, GLOBAL_BATCH, part=(rank, world))
            full, _ = DATA.batch(step, GLOBAL_BATCH)
            looked_up = {n: full["sparse"][:, i].reshape(-1).unique() for i, n in enumerate(names())}
            before = shard_report(tables, opt)
            dist.all_to_all_single = counted
            if max_norms:
                trainer.max_grad_norm = max_norms[step]
            try:
                losses.append(trainer.step(inputs, clicks, GLOBAL_BATCH))
            finally:
                dist.all_to_all_single = real
            norms.append(trainer.last_grad_norm)
            grads.append(dense_grads(model))  # HybridTrainer clears them at the next step
            untouched += untouched_rows_kept(before, shard_report(tables, opt), looked_up)
        dense = {n: p.detach().clone() for n, p in model.named_parameters()
                 if not n.startswith("tables.")}
        results[(placement_kind, kind)] = {"losses": losses, "shards": shard_report(tables, opt),
                                           "dense": dense, "grads": grads,
                                           "untouched": untouched, "norms": norms,
                                           "all_to_all_calls": calls[0]}
    dist.barrier()
    return results


def assemble(rank_results: list[dict], key) -> tuple[dict, dict]:
    """Full tables and row states from every rank's shards (replicated: rank 0's copy)."""
    weights, states = {}, {}
    for name in names():
        w = torch.full((CONFIG.rows_per_table, CONFIG.embedding_dim), float("nan"))
        st: dict[str, torch.Tensor] = {}
        for result in rank_results:
            shard = result[key]["shards"].get(name)
            if shard is None:
                continue
            rows, (c0, c1), weight, state = shard
            w[rows, c0:c1] = weight
            for k, v in state.items():
                full = st.setdefault(k, torch.full((CONFIG.rows_per_table,) + tuple(
                    v.shape[1:]) if v.dim() == 1 else w.shape, float("nan")))
                if v.dim() == 1:
                    full[rows] = v
                else:
                    full[rows, c0:c1] = v
        weights[name], states[name] = w, st
    return weights, states


def relative_error(a: torch.Tensor, b: torch.Tensor, travel: float = 0.0) -> float:
    """max|a - b| over b's scale: max|b|, plus `travel` (how far an element may have moved
    on its way to b, whose rounding is relative to that)."""
    return float((a - b).abs().max() / (b.abs().max() + travel).clamp(min=1e-12))



def assert_run_matches(ranks: list, key, ref: dict, where: str, rtol: float) -> None:
    """One sharded run (`ranks`' results under `key`) equals the single-process `ref`:
    every rank's losses, each table's assembled rows and optimizer slots (no row left
    unheld), every step's dense gradients, and the dense parameters (under Adam on the
    scale they travelled, `adam_travel_bound`: Adam's update ignores the gradient's size,
    so the gradients are what shows a wrong divisor), all within `rtol` relative."""
    for r in ranks:  # every rank reports the same global loss
        torch.testing.assert_close(torch.tensor(r[key]["losses"]), torch.tensor(ref["losses"]),
                                   rtol=rtol, atol=0, msg=lambda m: f"{where}: losses {m}")
    weights, states = assemble(ranks, key)
    for name in names():
        assert not weights[name].isnan().any(), f"{where}: {name} has rows no shard holds"
        err = relative_error(weights[name], ref["params"][f"{name}.weight"])
        assert err <= rtol, f"{where}: {name} differs by {err:.2e} relative"
        for slot, value in states[name].items():
            err = relative_error(value, ref["state"][name][slot])
            assert err <= rtol, f"{where}: {name} {slot} differs by {err:.2e} relative"
    assert len(ranks[0][key]["grads"]) == len(ref["grads"]) == STEPS, where
    for step, (grads, ref_grads) in enumerate(zip(ranks[0][key]["grads"], ref["grads"])):
        assert grads.keys() == ref_grads.keys(), where
        for n, g in grads.items():
            err = relative_error(g, ref_grads[n])
            assert err <= rtol, f"{where}: step {step} dense {n}.grad differs by {err:.2e} relative"
    for n, p in ranks[0][key]["dense"].items():
        err = relative_error(p, ref["params"][n], ref["dense_travel"])
        assert err <= rtol, f"{where}: dense {n} differs by {err:.2e} relative"
