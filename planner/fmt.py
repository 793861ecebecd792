"""Formatting for people: byte and count units, fixed-width tables, a progress line."""

from __future__ import annotations

import re
import sys

# C0 controls but tab and newline, DEL and C1 controls: what could drive a terminal.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """`text` with terminal control characters (escape sequences, carriage returns, bells)
    written as `\\x1b`: text from a file prints as text, never as terminal commands."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str) -> str:
    """`text` as one printable line: line breaks become "; ", controls are escaped."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return escape_controls("; ".join(lines))


_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    n = float(n)
    for unit in _BYTE_UNITS:
        if abs(n) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} PiB"


def human_count(n: float) -> str:
    """1.23B, 45.6M, 7.8K: parameter counts and FLOPs for tables."""
    n = float(n)
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{n:.0f}"


def table(headers: list[str], rows: list[list[object]], right: set[int] | None = None) -> str:
    """A plain fixed-width table; columns in `right` (default: all but the first two) align right."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    right = set(range(2, len(headers))) if right is None else right

    def line(row):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


class Progress:
    """`[3/10] blocks.2` on one stderr line, only when stderr is a terminal."""

    def __init__(self, what: str, stream=None):
        self.what = what
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()

    def __call__(self, done: int, total: int, item: str = "") -> None:
        if self.enabled:
            self.stream.write(f"\r{self.what} [{done + 1}/{total}] {item[:50]:<50}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()
