"""Property-based fuzzing of the data files (issue 16): Hypothesis mutates a valid plan
file and a valid cluster spec (values, types, dropped and added keys, deeper nesting) and
the command line must either accept the file (exit 0) or refuse it with one line
(`planner: error: ...`, exit 2): never a traceback, an internal error or a hang.

Bounded and reproducible: `derandomize=True` (the same examples on every run, so CI
cannot flake), a fixed number of examples and a deadline per example. The layer graph
of gpt-tiny is traced once and reused: this fuzzes reading files, not tracing.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_run import run_cli
from tests.layer_graphs import commands_trace_once

GOOD_PLAN = ["plan", "gpt-tiny", "--cluster", "local", "--gpus-per-node", "2", "--global-batch",
             "8", "--uniform", "--dp", "2", "--pp", "1", "--micro-batch", "4"]
FUZZ = settings(max_examples=150, deadline=timedelta(seconds=20), derandomize=True,
                database=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])

# Any JSON value, including what JSON writers emit for odd floats and what stresses a
# reader: huge integers, NaN and infinities, control characters, deep little structures.
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "{:>9999}", "%s%n", "\x1b[2J", "gpt-tiny", "zero3",
                     "1f1b", "planner.plan/v1", "os.path:join", "hf:/etc", "../../etc/passwd"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def paths(value, prefix=()):
    """Every (container path) in a JSON value, the root first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*prefix, i))


def _at(value, path):
    for key in path:
        value = value[key]
    return value


@st.composite
def mutated(draw, base: dict):
    """`base` with 1-3 mutations at random places."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        every = list(paths(data))
        path = draw(st.sampled_from(every))
        kind = draw(st.sampled_from(["replace", "drop", "add", "wrap", "stringify", "nest",
                                     "scale"]))
        if not path:
            if kind in ("wrap", "replace"):
                data = [data] if kind == "wrap" else draw(VALUES)
            continue
        parent, key = _at(data, path[:-1]), path[-1]
        old = parent[key]
        if kind == "replace":
            parent[key] = draw(VALUES)
        elif kind == "drop":
            del parent[key]
        elif kind == "add" and isinstance(old, dict):
            old[draw(st.text(max_size=10))] = draw(VALUES)
        elif kind == "add" and isinstance(old, list):
            old.append(draw(VALUES))
        elif kind == "wrap":
            parent[key] = draw(st.sampled_from([[old], {"value": old}]))
        elif kind == "stringify":
            parent[key] = json.dumps(old)
        elif kind == "nest":
            parent[key] = _nested(old, draw(st.integers(1, 200)))
        elif kind == "scale" and isinstance(old, (int, float)) and not isinstance(old, bool):
            factor = draw(st.sampled_from([-1, 0, 2, 10**6, 10**20]))
            parent[key] = old * factor if not (isinstance(old, float) and math.isinf(old)) else old
    return data


def _nested(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


def check(result) -> None:
    lines = result.stderr.strip().splitlines()
    context = f"exit {result.code}: {result.stderr[-1500:]}"
    assert result.code in (0, 2), context
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, context
    if result.code == 2:
        assert len(lines) == 1 and lines[0].startswith("planner: error: "), context


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """(plan, spec) JSON objects, and gpt-tiny's layer graph traced once for all examples."""
    from cost_models.clusters import get_cluster

    folder = tmp_path_factory.mktemp("fuzz")
    assert run_cli([*GOOD_PLAN, "--out", str(folder / "plan.json")]).code == 0
    plan = json.loads((folder / "plan.json").read_text())
    with commands_trace_once():
        yield plan, get_cluster("a100-80g").to_dict()


def _run_on_file(text: str, argv_for) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "input.json")
        with open(path, "w") as fh:
            fh.write(text)
        for argv in argv_for(path):
            check(run_cli(argv))
        assert os.listdir(folder) == ["input.json"]  # nothing written beside it


def test_mutated_plan_files_are_accepted_or_refused_in_one_line(good):
    plan, _ = good

    @FUZZ
    @given(mutated(plan))
    def fuzz(data):
        _run_on_file(json.dumps(data), lambda path: [["show", path],
                                                ["estimate", "--plan", path, "--json"]])

    fuzz()


def test_mutated_cluster_specs_are_accepted_or_refused_in_one_line(good):
    _, spec = good

    @FUZZ
    @given(mutated(spec))
    def fuzz(data):
        _run_on_file(json.dumps(data), lambda path: [["estimate", "gpt-tiny", "--cluster", path,
                                                 "--global-batch", "8", "--json"]])

    fuzz()
