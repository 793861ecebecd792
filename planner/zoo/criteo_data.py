"""Synthetic Criteo-like click data for `dlrm`: 13 dense features, one categorical feature
per table with power-law (Zipf) ids, click labels; batch k depends only on (seed, k).

    data = CriteoSynthetic(rows_per_table=(1000,) * 26, seed=0)
    inputs, clicks = data.batch(k, 4096)   # {"dense": (B, 13), "sparse": (B, 26, L)}, (B,)
    inputs, clicks = data.batch(k, 4096, part=(rank, world))   # this rank's rows of it

What mimics Criteo (Criteo AI Lab's 1TB click logs as DLRM/MLPerf preprocess them):
dense features are log(1 + count) of heavy-tailed counts; a categorical id's popularity
rank follows a bounded Zipf law, so a few rows take most lookups (the hot rows that make
row-wise shards unbalanced); ids are the popularity ranks hashed into the table (Criteo
ids are hashed categories), so hot rows land anywhere in the key range, not at its
start. Labels are drawn from a fixed logistic model of the features, ~25% positive.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ir.embedding_tables import mix64

# Zipf exponent of the id popularity: an assumption near the ~1 power laws reported for
# Criteo's categorical features (e.g. Adnan et al. 2021, "Accelerating Recommendation
# System Training 15x with RAM-Efficient Caching"); > 1 keeps the inverse CDF finite.
ZIPF_EXPONENT = 1.05
DENSE_FEATURES = 13  # Criteo's integer features I1..I13
CATEGORICAL_FEATURES = 26  # Criteo's categorical features C1..C26
MEAN_COUNT = 20.0  # mean of the exponential counts behind a dense feature (assumption)
CLICK_BIAS = -1.2  # logistic bias: sigmoid(-1.2) ~ 0.23, near Criteo's ~25% click rate
_BATCH_STRIDE = 1_000_003  # a prime: (seed, batch) -> a distinct generator seed


def zipf_ranks(count: int, rows: int, exponent: float, generator: torch.Generator) -> torch.Tensor:
    """`count` popularity ranks in [0, rows), P(rank k) ~ (k + 1)^-exponent, by the inverse
    CDF of the continuous power law on [1, rows + 1) (Clauset et al. 2009, eq. D.4)."""
    u = torch.rand(count, generator=generator, dtype=torch.float64)
    a = 1.0 - exponent
    x = (((rows + 1.0) ** a - 1.0) * u + 1.0) ** (1.0 / a)  # in [1, rows + 1)
    return (x.floor().to(torch.int64) - 1).clamp_(0, rows - 1)


def _scatter(ranks: torch.Tensor, rows: int, salt: int) -> torch.Tensor:
    """Popularity rank -> id: splitmix64 into [0, rows) (collisions merge categories, as
    Criteo's hashing does)."""
    return torch.remainder(mix64(ranks, salt), rows)


@dataclass(frozen=True)
class CriteoSynthetic:
    rows_per_table: tuple[int, ...] = (1000,) * CATEGORICAL_FEATURES
    dense_features: int = DENSE_FEATURES
    lookups_per_table: int = 1  # Criteo is one-hot; >1 makes multi-hot bags
    zipf_exponent: float = ZIPF_EXPONENT
    seed: int = 0

    def batch(self, index: int, batch_size: int, part: tuple[int, int] | None = None):
        """Global batch `index` of `batch_size` samples, or `part=(rank, world)`'s
        contiguous share of it (batch_size must divide by world)."""
        g = torch.Generator().manual_seed(self.seed * _BATCH_STRIDE + index)
        n, tables, lookups = batch_size, len(self.rows_per_table), self.lookups_per_table
        counts = torch.empty(n, self.dense_features, dtype=torch.float64).exponential_(
            1.0 / MEAN_COUNT, generator=g)
        dense = torch.log1p(counts.floor()).float()  # (B, 13)
        sparse = torch.empty(n, tables, lookups, dtype=torch.int64)  # (B, tables, L)
        for t, rows in enumerate(self.rows_per_table):
            ranks = zipf_ranks(n * lookups, rows, self.zipf_exponent, g)
            sparse[:, t] = _scatter(ranks, rows, salt=t * 7919).view(n, lookups)
        weights = torch.randn(self.dense_features, generator=torch.Generator().manual_seed(
            self.seed))  # the fixed logistic model
        logits = CLICK_BIAS + 0.3 * (dense - dense.mean()) @ weights
        clicks = (torch.rand(n, generator=g) < torch.sigmoid(logits)).float()
        if part is not None:
            rank, world = part
            if batch_size % world:
                raise ValueError(f"global batch {batch_size} does not split over {world} ranks")
            share = slice(rank * (n // world), (rank + 1) * (n // world))
            dense, sparse, clicks = dense[share], sparse[share], clicks[share]
        return {"dense": dense, "sparse": sparse}, clicks
