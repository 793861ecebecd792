"""Command-line values checked where argparse parses them: whole numbers in a range,
finite positive numbers, byte sizes, devices and output paths.

Each factory returns an argparse `type=` function whose error names what is wrong and
what to write instead; `planner.cli` prints it as one line with exit status 2.

    >>> count(1)("8"), seconds()("2.5")
    (8, 2.5)
"""

from __future__ import annotations

import argparse
import math
import os
import re

from ir.errors import PlannerError
from ir.output_file import check_output_path

# Upper bounds that no real job reaches: beyond them a value is a typo (and would make
# the search enumerate or allocate by it).
MAX_DEVICES = 2**20
MAX_SAMPLES = 2**40
MAX_SEQ_LEN = 2**24
MAX_GIB = 2**20  # a per-device memory budget, GiB
MAX_SECONDS = 10**7
MAX_MESSAGE_BYTES = 2**40

_SIZE = re.compile(r"(?i)\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([KMGT]?)(?:I?B)?\s*")
_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,3})?")
# What matplotlib writes, by file extension (no extension: PNG).
CHART_FORMATS = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif",
                 ".tiff", ".webp")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def count(low: int = 1, high: int = MAX_SAMPLES, example: int = 8):
    """A whole number in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number such as {example}, got "
                                             f"{_shown(text)}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if value > high:
            shown = f"{value:,}" if len(str(value)) < 30 else f"a {len(str(value))}-digit number"
            raise argparse.ArgumentTypeError(f"must be <= {high:,}, got {shown}")
        return value
    parse.__name__ = "whole number"
    return parse


# The common ones: a device count or degree, a sample count, a sequence length.
n_devices = count(1, MAX_DEVICES)
n_samples = count(1, MAX_SAMPLES)
n_tokens = count(1, MAX_SEQ_LEN, 2048)


def _finite(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 2.5, got "
                                         f"{_shown(text)}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {_shown(text)}")
    return value


def positive(high: float, unit: str):
    """A finite number in (0, high], in `unit` (for the message)."""
    def parse(text: str) -> float:
        value = _finite(text)
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(f"must be a number of {unit} above 0 and at most "
                                             f"{high:,}, got {text.strip()}")
        return value
    parse.__name__ = "number"
    return parse


def seconds():
    """A finite number of seconds > 0."""
    return positive(MAX_SECONDS, "seconds")


def gib():
    """A per-device memory size in GiB, finite and > 0."""
    return positive(MAX_GIB, "GiB")


def byte_size(text: str) -> int:
    """'64M' -> 67108864, '4096' -> 4096 (K, M, G, T are powers of 1024); finite, >= 1."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise argparse.ArgumentTypeError(f"cannot read {_shown(text)} as a size; use e.g. "
                                          "4096, 64K, 256M")
    value = float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]
    if not 1 <= value <= MAX_MESSAGE_BYTES:
        raise argparse.ArgumentTypeError(f"size {_shown(text)} must be between 1 byte and 1T")
    return int(value)


def device(text: str) -> str:
    """cpu, cuda or cuda:N."""
    if not _DEVICE.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"unknown device {_shown(text)}; use cpu, cuda or "
                                         "cuda:N")
    return text.strip()


def check_out(path: str | None, flag: str = "--out") -> None:
    """Raise before any work unless `path` (if given) can be written."""
    if path is not None:
        check_output_path(path, flag)


def check_chart(path: str | None, flag: str = "--chart") -> None:
    """`check_out` plus a file extension matplotlib can write."""
    if path is None:
        return
    check_output_path(path, flag)
    ext = os.path.splitext(path)[1].lower()
    if ext and ext not in CHART_FORMATS:
        raise PlannerError(f"{flag} {path}: cannot draw a {ext} file; use one of "
                           f"{', '.join(CHART_FORMATS)}")
