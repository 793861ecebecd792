"""Reading a JSON data file (plan, cluster spec, profile, HF config) that may be hostile.

Plans, specs and profiles are data: this reader never imports or runs anything, and it
refuses, with one line that names the file, everything that would make `json.load` hang,
crash or return something the planner cannot compute with:

  - what is not a regular file (a FIFO would block `open`, `/dev/zero` never ends, a
    folder or a symlink loop raise mid-read): the path is opened with O_NONBLOCK and
    checked with `fstat` before one byte is read;
  - files over `max_bytes` (size from `fstat`, before reading);
  - bytes that are not UTF-8;
  - nesting deeper than `MAX_DEPTH` (Python's parser recurses: 100k brackets raise
    RecursionError), counted outside strings before parsing;
  - NaN, Infinity and numbers that overflow a float (the stdlib accepts them), integers
    of more than `MAX_INT_DIGITS` digits, and keys repeated in one object (the stdlib
    keeps the last silently).

    >>> data = read_json("plan.json", "plan file", "re-create it with `planner plan`")  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat

from ir.errors import PlannerError

# A plan for 16k ranks written with indent=2 is ~80 MiB; nothing the planner writes is larger.
MAX_JSON_BYTES = 256 * 2**20
# Plans and specs nest 5 deep; 64 leaves room and stays far below Python's recursion limit.
MAX_DEPTH = 64
# 2**63 has 19 digits: no count, byte size or rank in these files needs more.
MAX_INT_DIGITS = 19

_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a backslash and the byte it escapes
_STRING = re.compile(rb'"[^"]*"')  # after escapes are gone, a string ends at the next quote
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_LEVEL = bytes.maketrans(b"[{]}", b"(())")


class _Refused(ValueError):
    """A value the parser hooks refuse (carries the message without JSON's position)."""


def open_regular_file(path: str | os.PathLike, what: str, fix: str, max_bytes: int) -> bytes:
    """The bytes of `path` if it is a readable regular file of at most `max_bytes`."""
    source = os.fspath(path)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise PlannerError(f"cannot read {what} {source!r}: it does not exist; {fix}") from None
    except IsADirectoryError:
        raise PlannerError(f"{what} {source!r} is a folder, not a file; give the JSON file "
                           "inside it") from None
    except PermissionError:
        raise PlannerError(f"{what} {source!r} is not readable (permission denied); fix its "
                           f"permissions (chmod u+r) or copy it") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PlannerError(f"{what} {source!r} is a symlink loop; point the link at a real "
                               "file") from None
        raise PlannerError(f"{what} {source!r} cannot be opened ({exc.strerror}); {fix}") \
            from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise PlannerError(f"{what} {source!r} is a folder, not a file; give the JSON file "
                               "inside it")
        if not stat.S_ISREG(info.st_mode):
            raise PlannerError(f"{what} {source!r} is a {_kind(info.st_mode)}, not a regular "
                               f"file; save the JSON to a file and give its path")
        if info.st_size > max_bytes:
            raise PlannerError(f"{what} {source!r} is {info.st_size / 2**20:,.0f} MiB, over the "
                               f"{max_bytes / 2**20:,.0f} MiB a JSON data file may have; {fix}")
        chunks, total = [], 0
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError as exc:
                raise PlannerError(f"{what} {source!r} cannot be read ({exc.strerror}); "
                                   f"{fix}") from None
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # it grew while we read
                raise PlannerError(f"{what} {source!r} is over the {max_bytes / 2**20:,.0f} "
                                   f"MiB a JSON data file may have; {fix}")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _nests_deeper_than(text: str, limit: int) -> bool:
    """Whether brackets outside string literals nest deeper than `limit`, in C-speed
    passes (no recursion, linear time per pass): drop escape pairs, keep only quotes and
    brackets, drop strings, then peel innermost `[]`/`{}` pairs a level per pass."""
    skeleton = _ESCAPE.sub(b"", text.encode("utf-8", "surrogatepass")).translate(
        None, _NOT_STRUCTURE)
    brackets = _STRING.sub(b"", skeleton).replace(b'"', b"").translate(_LEVEL)
    for _ in range(limit):
        peeled = brackets.replace(b"()", b"")
        if len(peeled) == len(brackets):
            break  # no pair left: what remains is unbalanced, not deep
        brackets = peeled
    # Pairs left after `limit` peels, or more unclosed openers than that (a deep and
    # truncated file), are deeper than `limit`.
    return b"()" in brackets or brackets.count(b"(") > limit


def _constant(name: str):
    raise _Refused(f"{name} is not a number JSON allows; write a finite number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text} overflows a float; write a finite number")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits is out of range (at most "
                       f"{MAX_INT_DIGITS}); write a realistic number")
    return int(text)


def _object(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"key {key!r} appears twice in one object; keep one")
        out[key] = value
    return out


def parse_json(text: str, source: str, what: str, fix: str) -> object:
    """Parse `text` under the same bounds as `read_json` (depth, finite numbers, no
    repeated keys); errors name `what` `source` and end with `fix`."""
    if _nests_deeper_than(text, MAX_DEPTH):
        raise PlannerError(f"{what} {source!r} nests more than {MAX_DEPTH} levels deep, more "
                           f"than a JSON data file may have; {fix}")
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int,
                          object_pairs_hook=_object)
    except _Refused as exc:
        raise PlannerError(f"{what} {source!r}: {exc}") from None
    except json.JSONDecodeError as exc:
        ends_early = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        kind = "truncated" if ends_early else "malformed"
        raise PlannerError(f"{what} {source!r} is not valid JSON ({kind} JSON at line "
                           f"{exc.lineno}, column {exc.colno}: {exc.msg}); {fix}") from None
    except RecursionError:  # brackets the depth count did not see (it cannot happen)
        raise PlannerError(f"{what} {source!r} nests too deep; {fix}") from None


def read_json(path: str | os.PathLike, what: str, fix: str,
              max_bytes: int = MAX_JSON_BYTES) -> object:
    """The parsed JSON of a data file, refusing special files, huge or deep files,
    non-UTF-8 bytes and non-finite numbers with one line naming the file.

    `what` names the kind of file ("plan file"), `fix` says how to get a good one
    ("re-create it with `planner plan`")."""
    source = os.fspath(path)
    raw = open_regular_file(source, what, fix, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlannerError(f"{what} {source!r} is not UTF-8 text (byte {exc.start}: "
                           f"{raw[exc.start:exc.start + 1]!r}); JSON files are UTF-8: {fix}") \
            from None
    if text.startswith("\ufeff"):  # a byte-order mark some editors write
        text = text[1:]
    return parse_json(text, source, what, fix)
