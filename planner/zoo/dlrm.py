"""DLRM: a deep learning recommendation model (Naumov et al. 2019).

    bottom_mlp (dense features -> embedding_dim)
    tables["0" .. "t-1"] (EmbeddingBag, sum of lookups_per_table ids each)
    interaction (pairwise dot products of the t+1 feature vectors)
    top_mlp (-> one logit per sample)

The tables hold almost all parameters and almost no FLOPs, the MLPs the reverse: the
planner's classic case for sharding tables and replicating the MLPs. The repeated units
are tables, so the container is named `tables` (not `blocks`); each table reads column
`int(name)` of the sparse ids, so deleting tables keeps the others reading their own ids.
The model is a DAG (every table feeds the interaction), not a chain: it is not meant to be
split into pipeline stages, though `bottom_mlp` and `top_mlp` may be set to None (forward
then takes the bottom output / returns the interaction features).

Layer widths: `bottom_mlp` and `top_mlp` list the hidden widths; the last bottom layer
(to embedding_dim) and the last top layer (to 1 logit) are added, so MLPerf's bottom
"512-256-128" and top "1024-1024-512-256-1" are bottom_mlp=(512, 256), top_mlp=(1024,
1024, 512, 256) with embedding_dim=128.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.zoo import _common


@dataclass(frozen=True)
class Config:
    num_tables: int = 4  # categorical features, one embedding table each (Criteo: 26)
    rows_per_table: int = 100  # ids per table (hashed categories)
    embedding_dim: int = 16  # D: width of every embedding and of the bottom MLP output
    dense_features: int = 13  # continuous features (Criteo: 13)
    bottom_mlp: tuple[int, ...] = (64, 32)  # hidden widths before the final -> embedding_dim layer
    top_mlp: tuple[int, ...] = (64, 32)  # hidden widths before the final -> 1 layer
    lookups_per_table: int = 2  # ids summed per table per sample (multi-hot)
    # rows of each table when they differ (length num_tables); empty: rows_per_table each
    table_rows: tuple[int, ...] = ()

    def __post_init__(self):
        _common.check_positive("dlrm", self, "num_tables", "rows_per_table", "embedding_dim",
                               "dense_features", "lookups_per_table")
        if self.table_rows and (len(self.table_rows) != self.num_tables
                                or not all(isinstance(r, int) and r > 0 for r in self.table_rows)):
            raise ValueError(f"dlrm: table_rows must list {self.num_tables} positive ints, "
                             f"got {self.table_rows!r}")
        for name in ("bottom_mlp", "top_mlp"):
            widths = getattr(self, name)
            if not isinstance(widths, tuple) or not all(isinstance(w, int) and w > 0 for w in widths):
                raise ValueError(f"dlrm: {name} must be a tuple of positive ints, got {widths!r}")

    def rows(self, table: int) -> int:
        return self.table_rows[table] if self.table_rows else self.rows_per_table

    @property
    def interaction_features(self) -> int:
        """Top MLP input: the bottom output plus one dot product per pair of feature vectors."""
        n = self.num_tables + 1
        return self.embedding_dim + n * (n - 1) // 2


def mlp(widths: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Interaction(nn.Module):
    """Dot products between every pair of the (1 + tables) feature vectors, plus the bottom output."""

    def forward(self, bottom: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        n = 1 + len(pooled)  # a Python int: the tables present, known while tracing
        features = torch.stack([bottom] + pooled, dim=1)  # (B, n, D)
        products = features @ features.transpose(1, 2)  # (B, n, n)
        pairs = torch.tril_indices(n, n, offset=-1, device=bottom.device)  # (2, n(n-1)/2)
        dots = products[:, pairs[0], pairs[1]]  # (B, n(n-1)/2): each pair once
        return torch.cat([bottom, dots], dim=1)  # (B, D + n(n-1)/2)


class DLRM(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.bottom_mlp = mlp([c.dense_features, *c.bottom_mlp, c.embedding_dim], last_relu=True)
        self.tables = nn.ModuleDict({
            str(i): nn.EmbeddingBag(c.rows(i), c.embedding_dim, mode="sum")
            for i in range(c.num_tables)})
        self.interaction = Interaction()
        self.top_mlp = mlp([c.interaction_features, *c.top_mlp, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom_mlp(dense) if self.bottom_mlp is not None else dense  # (B, D)
        # sparse (B, tables, lookups) -> per table (B, lookups) ids -> (B, D) sums
        pooled = [table(sparse[:, int(name)]) for name, table in self.tables.items()]
        z = self.interaction(x, pooled)  # (B, D + n(n-1)/2)
        return self.top_mlp(z).squeeze(-1) if self.top_mlp is not None else z  # (B,) logits

    def table_inputs(self, dense: torch.Tensor, sparse: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ids forward gives each table, before it runs: sharded tables exchange them
        all at once (executors.sharded_embedding, TorchRec's KeyedJaggedTensor)."""
        return {f"tables.{name}": sparse[:, int(name)] for name in self.tables}


def init_weights(model: DLRM) -> None:
    """The DLRM reference init: tables U(±sqrt(1/rows)), Linear N(0, sqrt(2/(fan_in+fan_out)))."""
    for module in model.modules():
        if isinstance(module, nn.EmbeddingBag):
            bound = module.num_embeddings ** -0.5
            nn.init.uniform_(module.weight, -bound, bound)
        elif isinstance(module, nn.Linear):
            fan_out, fan_in = module.weight.shape
            nn.init.normal_(module.weight, 0.0, (2.0 / (fan_in + fan_out)) ** 0.5)
            nn.init.normal_(module.bias, 0.0, (1.0 / fan_out) ** 0.5)


def build(config: Config) -> DLRM:
    model = DLRM(config)
    init_weights(model)
    return model


def example_inputs(config: Config, micro_batch: int, seq_len: int | None = None, device="cpu",
                   generator: torch.Generator | None = None):
    """({"dense": (B, dense_features), "sparse": (B, tables, lookups)}, click labels (B,) in {0., 1.})."""
    B = micro_batch
    dense = _common.randn((B, config.dense_features), device, generator)
    if config.table_rows:  # each table's ids below its own row count
        sparse = torch.stack([_common.randint(config.rows(i), (B, config.lookups_per_table),
                                              device, generator)
                              for i in range(config.num_tables)], dim=1)
    else:
        sparse = _common.randint(config.rows_per_table,
                                 (B, config.num_tables, config.lookups_per_table), device, generator)
    clicks = _common.randint(2, (B,), device, generator).float()
    return {"dense": dense, "sparse": sparse}, clicks


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(output, target)


def seq_len(config: Config) -> None:
    return None
