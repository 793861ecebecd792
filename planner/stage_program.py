"""The inner program: T*(a, b, r), the least time of layers a..b on one rank within its
memory, by a dynamic program over layers x layouts x memory buckets (the recurrence is
written out in `planner.search`'s docstring; one step of it is `_extend`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from planner.layer_tables import LayerTable

INF = math.inf


@dataclass
class _Node:
    """C[b] for one stage prefix (layouts x buckets). Choices are recovered on the walk
    back (`walk_back`), which only final plans need, so no back-pointers are stored."""

    value: np.ndarray
    parent: "_Node | None"
    table: LayerTable
    x_in: np.ndarray | None  # x(b-1, c', c) into this layer
    step: "_Step"
    best: dict | None = None  # u -> min_c C[b][c][u] and its c, once asked for
    sent: dict | None = None  # per send tuple: `StageSolver.sent`'s answer, once asked for


@dataclass
class _Step:
    """A layer table's per-(k, bucket, cap) index arrays, grouped by layout."""

    mem: np.ndarray  # buckets per strategy (units + 1 when over the cap)
    order: np.ndarray  # strategies sorted by layout, those that fit at all
    layouts: np.ndarray  # layout of each group
    starts: np.ndarray  # first row of each group in `order`
    # (rows, units+1): flat index into C[i-1] (layouts x buckets) of the row's layout at
    # the bucket before this layer, clipped
    src: np.ndarray
    # (rows, units+1): the strategy's time where src was >= 0, else inf (inf + any entry
    # is inf: what a mask would leave there)
    time: np.ndarray


def _step(table: LayerTable, k: float, bucket_bytes: float, cap: float, units: int,
          cache: dict, floor: bool = False) -> _Step:
    """A layer's buckets per strategy: its sum rounded up, or (`floor`) the walk's floor
    rounded down, so that any plan whose floors add up to the budget is admitted."""
    key = (id(table), k, bucket_bytes, cap, units, floor)
    hit = cache.get(key)
    step = hit[1] if hit is not None and hit[0] is table else None
    if step is None:
        state, kept, transient = table.memory(floor)
        scaled = (state + k * kept) / bucket_bytes
        mem = np.floor(scaled + 1e-9) if floor else np.ceil(scaled - 1e-9)
        mem = np.where(transient <= cap, mem, units + 1).astype(np.int64)
        fits = np.flatnonzero(mem <= units)
        order = fits[np.argsort(table.layout[fits], kind="stable")]
        layouts, starts = np.unique(table.layout[order], return_index=True)
        src = np.arange(units + 1)[None, :] - mem[order][:, None]
        time = np.where(src >= 0, table.time_s[order][:, None], INF)
        flat = table.layout[order][:, None] * (units + 1) + np.maximum(src, 0)
        step = _Step(mem, order, layouts, starts, flat, time)
        cache[key] = (table, step)  # the table too: its id is only unique while it lives
    return step


def _extend(parent: _Node | None, table: LayerTable, x_in: np.ndarray | None, step: _Step,
            n_layouts: int, units: int) -> _Node:
    """One step of the inner recurrence (module docstring), all strategies at once."""
    value = np.full((n_layouts, units + 1), INF)
    if step.order.size:
        if parent is None:  # C[first]: the time alone (an entry of 0 before it)
            vals = step.time
        else:  # min over the previous layout c' of C[i-1][c'][u] + x(c', c)
            entry = (parent.value[:, None, :] + x_in[:, :, None]).min(axis=0)
            vals = entry.take(step.src) + step.time  # entry[layout of row, src]
        if step.starts.size == 1:  # one layout: a plain min (reduceat costs several times it)
            value[step.layouts[0]] = vals.min(axis=0)
        else:
            value[step.layouts] = np.minimum.reduceat(vals, step.starts, axis=0)
    return _Node(value, parent, table, x_in, step)


def walk_back(node: _Node, tables: list[LayerTable], first: int, last: int, layout: int,
               u: int) -> list:
    """The strategies of layers first..last that reach `node`'s value at (layout, u)."""
    chosen = []
    for i in range(last, first - 1, -1):
        table, step, parent = node.table, node.step, node.parent
        if parent is None:
            entry_c = np.zeros(u + 1)
            from_layout = np.full(u + 1, -1)
        else:
            both = parent.value + node.x_in[:, layout][:, None]  # (c', buckets)
            from_layout = both.argmin(axis=0)
            entry_c = both.min(axis=0)
        best_s, best_v = -1, INF
        for s in np.flatnonzero((table.layout == layout) & (step.mem <= u)):
            v = entry_c[u - step.mem[s]] + table.time_s[s]
            if v < best_v:
                best_s, best_v = int(s), v
        chosen.append(table.strategies[best_s])
        prev_u = u - int(step.mem[best_s])
        layout, u, node = int(from_layout[prev_u]), prev_u, parent
    return chosen[::-1]


class StageSolver:
    """T*(a, b, r): the inner program over layers a..b for a rank with k in flight.

    A node is interned by (its parent node, the next layer's content), so ranges with the
    same run of layers share one table wherever they sit in the model."""

    def __init__(self, graph, tables, transitions, n_layouts, units, bucket_bytes, cap,
                 crossing: list[float], step_cache: dict | None = None,
                 places: list[tuple] | None = None, floor: bool = False, buffers=None,
                 host=None):
        self.graph, self.tables, self.transitions = graph, tables, transitions
        self.floor = floor  # add up the walk's floors (`_step`), not the program's sums
        # buffers(a, final): bytes a rank whose stage starts at a holds beyond its layers'
        # (None: none counted), taken off its budget (`units_within`)
        self.buffers = buffers
        self.within: dict[tuple[int, bool], int] = {}  # `units_within` by (a, final)
        self.host = host  # `stage_host.StageHost` (None: no placed change, GPUs)
        self.shifted: dict[tuple, tuple] = {}  # (table id, passes) -> (table, shifted)
        self.n_layouts, self.units, self.bucket, self.cap = n_layouts, units, bucket_bytes, cap
        self.by_range: dict[tuple, _Node] = {}
        self.by_content: dict[tuple, _Node] = {}
        # per (table, k, bucket, cap, units): solvers of one budget may share it
        self.step_cache: dict[tuple, tuple] = {} if step_cache is None else step_cache
        self.extensions = 0
        # A layer's content inside a stage: its hash, what of its place it prices
        # (`places`: `host_dispatch.host_position_key`, as `layer_tables` keys its tables) and the
        # bytes crossing into it.
        places = places if places is not None else [()] * len(graph.layers)
        self.elems = [((l.structural_hash, places[i]), crossing[i - 1] if i else 0.0)
                      for i, l in enumerate(graph.layers)]

    def node(self, a: int, b: int, k: float) -> _Node:
        node = self.by_range.get((a, b, k))
        if node is None:
            parent = self.node(a, b - 1, k) if b > a else None
            node = self.by_range[(a, b, k)] = self._child(parent, b, k)
        return node

    def units_within(self, a: int, b: int) -> int:
        """Buckets the layers of stage a..b may fill: the budget less `buffers`, rounded
        as the layers are (`_step`)."""
        if self.buffers is None:
            return self.units
        key = (a, b == len(self.graph.layers) - 1)  # what `buffers` reads
        units = self.within.get(key)
        if units is None:
            spare = self.buffers(*key) / self.bucket
            units = self.within[key] = self.units - int(
                math.floor(spare + 1e-9) if self.floor else math.ceil(spare - 1e-9))
        return units

    def best(self, a: int, b: int, k: float) -> tuple[float, int]:
        """(T*, the layout it ends in) of layers a..b."""
        return self._best_of(self.node(a, b, k), self.units_within(a, b))

    def bests(self, a: int, k: float, ends: list[int]):
        """(b, T*, layout, node) of layers a..b for each b of `ends` (ascending, >= a), in
        one walk from layer a: the partition program reads stages from a in this order."""
        node, b = None, a - 1
        for end in ends:
            while b < end:
                b += 1
                node = self._child(node, b, k)
            yield (end, *self._best_of(node, self.units_within(a, end)), node)

    def sent(self, node: _Node, send: tuple[float, ...],
             u: int) -> list[tuple[float, int, float]]:
        """(C[b][c][u] + send[c], c, send[c]) for the layouts c no other beats on both the
        stage's time with its send and the send alone (the next stage pays it again, as
        its gradient's send back: `partition.partition`), by increasing send; u: the
        stage's buckets (`units_within`)."""
        if node.sent is None:
            node.sent = {}
        hit = node.sent.get((id(send), u))
        if hit is not None and hit[0] is send:
            return hit[1]
        if u < 0:
            return []
        column = node.value[:, u].tolist()
        out, least = [], INF
        for c in sorted(range(len(send)), key=lambda c: (send[c], column[c])):
            t = column[c] + send[c]
            if t < least:
                out.append((t, c, send[c]))
                least = t
        node.sent[(id(send), u)] = (send, out)  # the tuple too: its id is unique while it lives
        return out

    def placed(self, a: int, b: int, k: float, r: int, node: _Node | None = None) -> _Node:
        """Layers a..b on rank r, its placed layers (`stage_host.StageHost.edges`: the edge
        layers and interior ones whose recent-ops window a cut clips) each shifted per
        strategy by its placed change (`StageHost.delta_s`, as the estimate prices it), so
        their strategies are chosen on it. `node`: the plain a..b node, where the caller
        has it. Interned by range and the placed layers' passes keys up to each layer."""
        edges = self.host.edges(a, b, r) if self.host is not None else None
        if not edges:
            return node if node is not None else self.node(a, b, k)
        first = min(edges)
        node = self.node(a, first - 1, k) if first > a else None
        passes: tuple = ()
        for j in range(first, b + 1):
            edge = edges.get(j)
            if edge is not None:
                passes += ((j, edge[0]),)
            key = (a, j, k, passes)
            hit = self.by_range.get(key)
            if hit is None:
                hit = self.by_range[key] = (self._child(node, j, k) if edge is None
                                            else self._shifted_child(node, j, k, edge))
            node = hit
        return node

    def least(self, node: _Node, u: int) -> tuple[float, int]:
        """(min_c C[b][c][u], that c) of a node (`placed`'s) in u buckets (`units_within`)."""
        return self._best_of(node, u)

    def _shifted_child(self, parent: _Node | None, b: int, k: float, edge: tuple) -> _Node:
        """Layer b after `parent`, its time per strategy + its placed change `edge`
        ((passes key, placed), `StageHost.edges`); interned by content as `_child`."""
        passes, placed = edge
        table = self.tables[b]
        hit = self.shifted.get((id(table), passes))
        if hit is None or hit[0] is not table:
            delta = np.array([self.host.delta_s(b, s, placed) for s in table.strategies])
            hit = self.shifted[(id(table), passes)] = (
                table, replace(table, time_s=table.time_s + delta))
        shifted = hit[1]
        content = (k, id(parent), self.elems[b] if parent is not None else self.elems[b][0],
                   id(shifted))
        node = self.by_content.get(content)
        if node is None:
            x_in = self.transitions[b - 1] if parent is not None else None
            step = _step(shifted, k, self.bucket, self.cap, self.units, self.step_cache,
                         self.floor)
            node = _extend(parent, shifted, x_in, step, self.n_layouts, self.units)
            self.by_content[content] = node
            self.extensions += 1
        return node

    def _child(self, parent: _Node | None, b: int, k: float) -> _Node:
        """Layer b after `parent` (None: b starts the stage), interned by content."""
        content = (k, id(parent), self.elems[b] if parent is not None else self.elems[b][0])
        node = self.by_content.get(content)
        if node is None:
            x_in = self.transitions[b - 1] if parent is not None else None
            step = _step(self.tables[b], k, self.bucket, self.cap, self.units, self.step_cache,
                         self.floor)
            node = _extend(parent, self.tables[b], x_in, step, self.n_layouts, self.units)
            self.by_content[content] = node
            self.extensions += 1
        return node

    def _best_of(self, node: _Node, u: int) -> tuple[float, int]:
        if u < 0:
            return INF, 0
        if node.best is None:
            node.best = {}
        best = node.best.get(u)
        if best is None:
            column = node.value[:, u]
            c = int(column.argmin())
            best = node.best[u] = (float(column[c]), c)
        return best
