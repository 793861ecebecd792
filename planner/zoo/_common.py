"""Helpers shared by the zoo families: example inputs that also work on meta, LM loss.

On `device="meta"` the helpers return meta tensors (shapes and dtypes, no data), so a
planner can trace a 175B model without touching memory. Elsewhere random data is drawn
on the generator's device (CPU by default) and then moved, so a seeded generator gives
the same inputs on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # label value the LM losses skip (PyTorch's cross_entropy default)


def _is_meta(device) -> bool:
    return torch.device(device).type == "meta"


def _source_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def randint(high: int, shape: tuple[int, ...], device="cpu",
            generator: torch.Generator | None = None) -> torch.Tensor:
    """int64 tensor of values in [0, high); on meta only the shape."""
    if _is_meta(device):
        return torch.empty(shape, dtype=torch.long, device="meta")
    values = torch.randint(0, high, shape, generator=generator, device=_source_device(generator))
    return values.to(device)


def randn(shape: tuple[int, ...], device="cpu",
          generator: torch.Generator | None = None) -> torch.Tensor:
    """float32 standard-normal tensor; on meta only the shape."""
    if _is_meta(device):
        return torch.empty(shape, dtype=torch.float32, device="meta")
    values = torch.randn(shape, generator=generator, device=_source_device(generator))
    return values.to(device)


def rand(shape: tuple[int, ...], device="cpu",
         generator: torch.Generator | None = None) -> torch.Tensor:
    """float32 uniform [0, 1) tensor; on meta only the shape."""
    if _is_meta(device):
        return torch.empty(shape, dtype=torch.float32, device="meta")
    values = torch.rand(shape, generator=generator, device=_source_device(generator))
    return values.to(device)


def resolve_seq(family: str, config_seq: int, seq_len: int | None, *, learned_positions: bool) -> int:
    """The sequence length to build inputs for: `seq_len` if given, else the config's.

    A learned position table has `config_seq` rows, so a longer sequence cannot be embedded.
    """
    if seq_len is None:
        return config_seq
    if seq_len < 1:
        raise ValueError(f"{family}: seq_len must be >= 1, got {seq_len}")
    if learned_positions and seq_len > config_seq:
        raise ValueError(
            f"{family}: seq_len={seq_len} exceeds the learned position table (seq={config_seq}); "
            f"pass seq_len <= {config_seq} or build the model with seq={seq_len}")
    return seq_len


def check_positive(family: str, config, *names: str) -> None:
    """ValueError naming the first field that is not a positive integer."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{family}: {name} must be a positive integer, got {value!r}")


def check_divisible(family: str, config, numerator: str, denominator: str) -> None:
    a, b = getattr(config, numerator), getattr(config, denominator)
    if a % b:
        raise ValueError(f"{family}: {numerator}={a} is not divisible by {denominator}={b}")


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy: logits (B, T, V), labels (B, T), IGNORE_INDEX skipped."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1),  # (B*T, V), (B*T,)
                           ignore_index=IGNORE_INDEX)


def causal_mask(length, device) -> torch.Tensor:
    """(T, T) bool, True above the diagonal: the future positions a query may not see."""
    positions = torch.arange(length, device=device)  # (T,)
    return positions[None, :] > positions[:, None]  # key index > query index
