"""The `planner` command: parse, call into the packages, print. No logic lives here.

Bad input raises `PlannerError` (or fails an argparse type check in planner/arg_types.py);
it is printed as one line `planner: error: ...`, control characters escaped, with exit
status 2 (a traceback only with --debug).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from ir.errors import PlannerError
from planner import commands
from planner.fmt import one_line


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, like every other bad input."""

    def error(self, message: str):
        # "argument --top: must be >= 1, got 0" reads as "--top must be >= 1, got 0"
        flag, _, rest = message.partition(": ")
        if flag.startswith("argument -") and rest.startswith("must "):
            message = f"{flag.removeprefix('argument ').split('/')[0]} {rest}"
        self.exit(2, f"planner: error: {one_line(message)} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="planner",
        description="Automatic parallelism planner for PyTorch: inspect, profile, estimate, plan.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"planner.commands.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (printed) or --help: a status, as below
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return int(args.func(args) or 0)
    except PlannerError as exc:
        if args.debug:
            raise
        print(f"planner: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("planner: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `planner ... | head`: the reader left; that is not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:  # an internal bug: say so briefly, full trace with --debug
        if args.debug:
            raise
        print(f"planner: internal error: {type(exc).__name__}: {one_line(str(exc))} (rerun "
              "with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
