"""The package arrows point one way: ir <- cost_models <- planner, ir <- executors."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = {"ir", "cost_models", "planner", "executors"}
ALLOWED = {
    "ir": {"ir"},
    "cost_models": {"ir", "cost_models"},
    "executors": {"ir", "executors"},
    "planner": {"ir", "cost_models", "planner"},
}
# planner may reach the executors only from the one-call API, from validate's trial run
# (its one-process reference steps the optimizer's param groups as the ranks do) and from
# the CPU kits' probe of the executor's own training loop.
PLANNER_MAY_IMPORT_EXECUTORS = {"api.py", "trial/rank.py", "trial/spawn.py", "trial/reference.py",
                                "commands/validate.py", "train_loop_probe.py"}
IR_THIRD_PARTY = {"torch", "networkx", "numpy"}


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_import_arrows():
    wrong = []
    for package, allowed in ALLOWED.items():
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT / package).as_posix()
            for name in _imports(path):
                if name not in PROJECT or name in allowed:
                    continue
                if package == "planner" and name == "executors" and rel in PLANNER_MAY_IMPORT_EXECUTORS:
                    continue
                wrong.append(f"{package}/{rel} imports {name}")
    assert not wrong, "wrong-way imports:\n" + "\n".join(wrong)


def test_ir_needs_only_torch_networkx_numpy():
    import sys

    stdlib = set(sys.stdlib_module_names)
    extra = set()
    for path in (ROOT / "ir").rglob("*.py"):
        for name in _imports(path):
            if name not in stdlib and name not in PROJECT and name not in IR_THIRD_PARTY:
                extra.add(f"{path.name}: {name}")
    assert not extra, extra


# STYLE.md: modules of 150-500 lines, one idea each (issue 19 brought them all under).
MAX_SOURCE_LINES = 500


def _too_long(paths) -> list[str]:
    return [f"{path}: {n} lines" for path in paths
            if (n := len(path.read_text().splitlines())) > MAX_SOURCE_LINES]


def test_no_source_file_exceeds_500_lines(tmp_path):
    paths = [path for package in sorted(PROJECT) for path in (ROOT / package).rglob("*.py")]
    assert len(paths) > 50  # the packages were found
    long = _too_long(paths)
    assert not long, f"split these by idea (at most {MAX_SOURCE_LINES} lines):\n" + "\n".join(long)
    over = tmp_path / "over.py"  # the check can fail
    over.write_text("x = 1\n" * (MAX_SOURCE_LINES + 1))
    assert _too_long([over]) and not _too_long([ROOT / "ir" / "__init__.py"])
