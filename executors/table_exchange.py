"""One exchange per phase for all the sharded tables of a step (TorchRec's fused
input/output dists), on plain all_to_all_single.

    pooled = lookup_tables([(module, ids, bags, num_bags), ...])  # one (bags, dim) per table

Phases, each ONE all_to_all_single however many tables there are:
  1. header   (world, 2T) int64: to each rank, the ids it gets of each table and this
              rank's bag count of each table (equal splits)
  2. ids      (id, bag) int64 pairs of every table, ordered by (destination rank, table):
              what each rank receives is source-major, table-minor, the header's counts
  3. pooled   each holder pools the rows it holds per (source rank, table, bag) and sends
              every table's block for a rank in one payload (source-major, table-minor);
              the requester adds each holder's block into that table's columns
  4. grads    backward, 3 in reverse: one payload of every table's pooled-gradient
              columns per holder; each holder gathers a sparse COO gradient of its shard
Splits are computed once per batch (`_route`). Every rank calls the four in the same
order, also when it holds or looks up nothing. One exchange carries one dtype: tables
of different dtypes are exchanged one group per dtype (in first-seen order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

# (module, ids (n,) int64, bags (n,) int64: each id's bag, num_bags): one table's request.
# `module` is an executors.sharded_embedding.ShardedEmbedding.
Request = tuple


@dataclass
class _Route:
    """One step's exchange for T tables, as this rank sees it (element counts per peer)."""

    modules: list  # the T ShardedEmbedding modules
    held: list[int]  # tables this rank holds a shard of
    local_rows: dict[int, torch.Tensor]  # held table -> (n,) shard rows of the ids served
    slots: dict[int, torch.Tensor]  # held table -> (n,) slot: source's bag offset + bag
    source_bags: torch.Tensor  # (world, T) bags of each source rank per table
    widths: list[int]  # this rank's shard columns per table (0 when it holds none)
    num_bags: list[int]  # this rank's bags per table
    send_splits: list[int]  # pooled values sent to each rank (all tables)
    recv_splits: list[int]  # pooled values received from each rank (all tables)


def _route(requests: list[Request], world: int) -> _Route:
    """Phases 1 and 2: every table's ids to their holders, in two calls."""
    T = len(requests)
    dests, ids, bags, tables = [], [], [], []
    for t, (module, table_ids, table_bags, _) in enumerate(requests):
        dest, table_ids, table_bags = module.destinations(table_ids, table_bags)
        dests.append(dest)
        ids.append(table_ids)
        bags.append(table_bags)
        tables.append(torch.full((len(dest),), t, dtype=torch.int64))
    key = torch.cat(dests) * T + torch.cat(tables)  # (n,) destination-major, table-minor
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=world * T).view(world, T)
    num_bags = [int(r[3]) for r in requests]
    header = torch.cat([counts, torch.tensor(num_bags).expand(world, T)], 1)  # (world, 2T)
    recv_header = torch.empty_like(header)
    dist.all_to_all_single(recv_header.view(-1), header.reshape(-1))
    recv_counts, source_bags = recv_header[:, :T], recv_header[:, T:]
    payload = torch.stack([torch.cat(ids)[order], torch.cat(bags)[order]], 1)  # (n, 2)
    received = payload.new_empty((int(recv_counts.sum()), 2))
    dist.all_to_all_single(received, payload, recv_counts.sum(1).tolist(),
                           counts.sum(1).tolist())
    modules = [r[0] for r in requests]
    held = [t for t, m in enumerate(modules) if m.shard is not None]
    local_rows, slots = {}, {}
    if held:
        flat = recv_counts.reshape(-1)
        table_of = torch.arange(T).repeat(world).repeat_interleave(flat)
        source_of = torch.arange(world).repeat_interleave(T).repeat_interleave(flat)
        for t in held:
            mine = table_of == t
            pairs, sources = received[mine], source_of[mine]
            rows = pairs[:, 0].contiguous()
            local_rows[t] = modules[t].to_local(rows)
            slots[t] = route_offsets(source_bags[:, t])[sources] + pairs[:, 1]
    widths = [m.shard.col_stop - m.shard.col_start if m.shard is not None else 0
              for m in modules]
    send_splits = (source_bags * torch.tensor(widths)).sum(1).tolist()
    recv_splits = [sum(n * (m.col_ranges[r][1] - m.col_ranges[r][0])
                       for n, m in zip(num_bags, modules) if m.col_ranges[r] is not None)
                   for r in range(world)]
    return _Route(modules, held, local_rows, slots, source_bags, widths, num_bags,
                  send_splits, recv_splits)


def route_offsets(bags: torch.Tensor) -> torch.Tensor:
    """(world,) where each source's bags start in a holder's slots of one table."""
    return torch.cumsum(bags, 0) - bags


class _FusedLookup(torch.autograd.Function):
    """pooled_t (bags_t, dim_t) for every table t from one all-to-all; gradient: one
    all-to-all, then a sparse-row gradient of each shard."""

    @staticmethod
    def forward(ctx, route: _Route, *weights: torch.Tensor):
        world = len(route.send_splits)
        partials, starts = {}, {}
        for t in route.held:  # (slots, width): sum of the rows served per source bag
            w = weights[t]
            partials[t] = w.new_zeros(int(route.source_bags[:, t].sum()), w.shape[1])
            if len(route.local_rows[t]):
                partials[t].index_add_(0, route.slots[t], w[route.local_rows[t]])
            starts[t] = route_offsets(route.source_bags[:, t]).tolist()
        counts = route.source_bags.tolist()
        pieces = [partials[t][starts[t][s]:starts[t][s] + counts[s][t]].reshape(-1)
                  for s in range(world) for t in route.held if counts[s][t]]
        reference = weights[0]
        send = torch.cat(pieces) if pieces else reference.new_empty(0)
        received = reference.new_empty(sum(route.recv_splits))
        dist.all_to_all_single(received, send, route.recv_splits, route.send_splits)
        outs = [w.new_zeros(n, m.table.dim)
                for w, n, m in zip(weights, route.num_bags, route.modules)]
        offset = 0
        for r in range(world):  # holder-major, table-minor, as the holders sent
            for t, m in enumerate(route.modules):
                cols = m.col_ranges[r]
                if cols is None or not route.num_bags[t]:
                    continue
                width = cols[1] - cols[0]
                size = route.num_bags[t] * width
                outs[t][:, cols[0]:cols[1]] += received[offset:offset + size].view(-1, width)
                offset += size
        ctx.route, ctx.shapes = route, [w.shape for w in weights]
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        route = ctx.route
        world = len(route.send_splits)
        pieces = [grads[t][:, m.col_ranges[r][0]:m.col_ranges[r][1]].reshape(-1)
                  for r in range(world) for t, m in enumerate(route.modules)
                  if m.col_ranges[r] is not None and route.num_bags[t]]
        send = torch.cat(pieces) if pieces else grads[0].new_empty(0)
        received = grads[0].new_empty(sum(route.send_splits))
        dist.all_to_all_single(received, send, route.send_splits, route.recv_splits)
        counts = route.source_bags.tolist()
        buffers = {t: [] for t in route.held}  # per held table, per source: (bags, width)
        offset = 0
        for s in range(world):  # source-major, table-minor, as forward sent them
            for t in route.held:
                size = counts[s][t] * route.widths[t]
                buffers[t].append(received[offset:offset + size].view(-1, route.widths[t]))
                offset += size
        out = []
        for t, shape in enumerate(ctx.shapes):
            if t in buffers:
                row_grads = torch.cat(buffers[t])[route.slots[t]]  # (n, width)
                rows = route.local_rows[t][None]
            else:
                row_grads = grads[t].new_empty((0, shape[1]))
                rows = torch.empty((1, 0), dtype=torch.int64)
            out.append(torch.sparse_coo_tensor(rows, row_grads, shape, check_invariants=False))
        return (None, *out)


def lookup_tables(requests: list[Request]) -> list[torch.Tensor]:
    """The pooled (num_bags, dim) sums of every request, 4 all-to-alls per dtype group."""
    if not requests:
        return []
    world = dist.get_world_size()
    groups: dict[torch.dtype, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(r[0].weight.dtype, []).append(i)
    pooled: list[torch.Tensor | None] = [None] * len(requests)
    for members in groups.values():
        group = [requests[i] for i in members]
        route = _route(group, world)
        outs = _FusedLookup.apply(route, *[r[0].weight for r in group])
        for i, out in zip(members, outs):
            pooled[i] = out
    return pooled
