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
# planner may reach the executors only from the one-call API and from validate's trial run.
PLANNER_MAY_IMPORT_EXECUTORS = {"api.py", "trial/rank.py", "trial/spawn.py", "commands/validate.py"}
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
