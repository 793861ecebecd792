"""Issue 14: every plan the planner proposes runs, on real Hugging Face models.

The subset `make test` runs (bench/bench_real_models.py runs all 147 cases): every
architecture in auto mode on 2 ranks, plus one representative of each other mode and
world size. Each target of the issue is one test, whose failure shows the cases that
miss it and the whole grid. The harness is tested before, with injected faults: a rank
that raises alone, a rank that dies, a case that hangs.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
import torch.distributed as dist

import real_models as rm
from real_models import CRASH, HANG, MISMATCH, PASS, REJECTED, Case
from real_models_groups import Limits, run_group, run_matrix

pytestmark = [pytest.mark.multiprocess]

# Representatives (why each): opt tp2 (the issue's silent TP mismatch), gpt2 pp2 (tied
# embeddings across stages), llama auto at 4 ranks (what the search picks for 4),
# qwen2_moe tp2 at 4 (experts under TP with DP), t5 pp2 at 4 (an encoder-decoder in a
# pipeline), llama tp2xpp2 (both at once).
REPRESENTATIVES = [Case("opt", "tp2", 2), Case("gpt2", "pp2", 2), Case("llama", "auto", 4),
                   Case("qwen2_moe", "tp2", 4), Case("t5", "pp2", 4),
                   Case("llama", "tp2xpp2", 4)]
SUBSET = rm.cases(modes=("auto",), worlds=(2,)) + REPRESENTATIVES
TARGETS = list(rm.target_failures([]))


# ----------------------------------------------------------------------------- classify


def ok(loss_rel=0.0, param_ok=True, missing=()):
    cmp = {"loss_rel": [0.0, loss_rel, 0.0], "missing": list(missing),
           "param": {"name": "w", "rel": 0.0 if param_ok else 1.0, "abs": 0.0, "ok": param_ok}}
    return {"state": "ok", "stage": "gather", "plan": "plan(...)", "losses": [1.0] * 3,
            "compare": cmp}


def failed(state, stage, error):
    return {"state": state, "stage": stage, "error": error}


CASE = Case("llama", "auto", 2)
TIMEOUT = "RuntimeError: [gloo] Timed out waiting 60000ms for recv operation to complete"


@pytest.mark.parametrize("results, status, words", [
    ([ok(), {"state": "ok", "stage": "gather"}], PASS, ""),
    ([ok(loss_rel=2 * rm.RTOL), {"state": "ok", "stage": "gather"}], MISMATCH, "step 2"),
    ([ok(loss_rel=float("nan")), {"state": "ok", "stage": "gather"}], MISMATCH, "nan at step 2"),
    ([ok(param_ok=False), {"state": "ok", "stage": "gather"}], MISMATCH, "param w"),
    ([ok(missing=["lm_head.weight"]), {"state": "ok", "stage": "gather"}], MISMATCH,
     "lm_head.weight"),
    ([failed("rejected", "plan", "PlannerError: pp needs more layers")] * 2, REJECTED,
     "more layers"),
    ([failed("rejected", "plan", "PlannerError: no"), failed("crash", "plan", TIMEOUT)],
     CRASH, "rejected on ranks [0] only (before training)"),
    ([failed("crash", "train", TIMEOUT), failed("crash", "train", "ValueError: shapes")],
     CRASH, "during training, train, rank 1: ValueError: shapes"),
    ([failed("crash", "train", TIMEOUT)] * 2, HANG, "timed out at train"),
])
def test_classify(results, status, words):
    outcome = rm.classify(CASE, results)
    assert outcome.status == status
    assert words in outcome.reason


def test_zero_dropout_leaves_no_random_op():
    model, inputs, _, _ = rm.build("bert")  # hidden and attention dropout 0.1 by default
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert model.config.hidden_dropout_prob == 0.0
    model.train()
    assert torch.equal(model(**inputs).logits, model(**inputs).logits)


def test_a_search_that_finds_no_plan_is_rejected_naming_the_model():
    """A search's "error: ..." (made ahead, `real_models_prep`) is a PlannerError naming
    the model on every rank: REJECTED, not a crash. (plan_case named an undefined `model`
    there, a NameError, so such a case read CRASH.)"""
    from types import SimpleNamespace

    from ir.errors import PlannerError

    graph = SimpleNamespace(model="LlamaForCausalLM")
    with pytest.raises(PlannerError, match="could not plan LlamaForCausalLM: no plan fits"):
        rm.plan_case(Case("llama", "tp2", 2), graph, 2, "error: no plan fits")
    assert rm.plan_case(Case("llama", "tp2", 2), graph, 2, "{}") == "{}"
    assert rm.plan_case(Case("llama", "auto", 2, "{ }"), graph, 2, "{}") == "{ }"  # a replay


# ----------------------------------------------------------------------------- harness
# Injected faults on 2 ranks, short limits: each case must get its outcome and the next
# case must still run, in a fresh process group (no groups left from the last case).

# Short: faults show fast (the test waits out one gloo timeout and one case limit). An
# "ok" case takes ~0.2 s, the raise-alone case one gloo timeout: both far inside 8 s.
FAULT_LIMITS = Limits(gloo_timeout_s=3, case_limit_s=8)


def fault_case(case: Case, ref, rank: int, log) -> dict:
    """A stand-in for run_case: `case.arch` names the fault to inject."""
    try:
        # Only the case's default group exists: the last case's sub-groups are gone.
        assert len(dist.distributed_c10d._world.pg_map) == 1, "process groups leaked"
        dist.new_group([0, 1])  # a sub-group, as DeviceMesh makes; it must not leak
        log("stage", stage="train")
        if case.arch == "raise-alone" and rank == 1:
            raise ValueError("injected on rank 1")
        if case.arch == "die" and rank == 1:
            os._exit(3)
        if case.arch == "hang":
            time.sleep(10 * FAULT_LIMITS.case_limit_s)
        total = torch.ones(1)
        dist.all_reduce(total)
        assert total.item() == 2
        return ok()
    except Exception as exc:
        return failed("crash", "train", rm._first_line(exc))


@pytest.mark.timeout(180)
def test_group_survives_faults():
    names = ["ok", "raise-alone", "ok", "die", "ok", "hang", "ok"]
    work = [(i, Case(name, "fault", 2), None) for i, name in enumerate(names)]
    outcomes = run_group(2, work, case_fn=fault_case, limits=FAULT_LIMITS)
    got = [outcomes[i].status for i in range(len(names))]
    assert got == [PASS, CRASH, PASS, CRASH, PASS, HANG, PASS], [
        (o.case.arch, o.status, o.reason) for o in outcomes.values()]
    assert "rank 1: ValueError: injected on rank 1" in outcomes[1].reason
    assert "process died (exit code 3)" in outcomes[3].reason
    assert f"no result within {FAULT_LIMITS.case_limit_s:.0f} s" in outcomes[5].reason


# ----------------------------------------------------------------------------- late work
# A search that never ends (a stuck solver) costs the matrix at most the prep's limit and
# leaves its case to the ranks; everything else the prep made in time stands.

# The most the late-prep test waits for its deadline (`until_only_stuck_left`), which
# comes once gpt2's and opt's reference, trace and searches are done: 5-6 s at load 0.5
# on the 2-core machine (measured), over 20 s at load 13-15 (a 20 s limit, waited in full
# every run, failed there). It only caps that wait, so it can be generous.
PREP_TEST_LIMIT_S = 120
STUCK = Case("gpt2", "tp2", 2)


def stuck_search(marker: str, case: Case, graph, world: int) -> str:
    """A stand-in for `search_plan`: a plan at once, but STUCK's search never ends (it
    writes `marker` as it starts)."""
    if case == STUCK:
        open(marker, "w").close()
        time.sleep(3600)
    return f'{{"searched": "{case.key}"}}'


def until_only_stuck_left(marker: str):
    """A deadline for `prepare_all`: it comes once STUCK's search has started (`marker`)
    and every other worker has exited, or at `limit_s`, whichever is first."""
    def wait(procs: list, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if os.path.exists(marker) and sum(p.is_alive() for p in procs) <= 1:
                return
            time.sleep(0.05)
    return wait


@pytest.mark.timeout(PREP_TEST_LIMIT_S + 120)
def test_a_late_prep_leaves_its_cases_to_the_ranks(monkeypatch, tmp_path, capsys):
    """The prep has a deadline: the worker stuck in STUCK's search is killed at it, what it
    saved before stands, STUCK is left to the ranks' search, and llama, which that worker
    never reached, gets its reference alone. (The parent used to wait for its workers
    without one: the whole matrix waited on one search.)"""
    import functools

    import real_models_prep as prep

    monkeypatch.setattr(prep, "PREP_WORKERS_MAX", 2)  # gpt2 then llama | opt
    monkeypatch.setattr(prep.os, "cpu_count", lambda: 2)
    selected = [Case("gpt2", "auto", 2), STUCK, Case("opt", "auto", 2), Case("opt", "tp2", 2),
                Case("llama", "auto", 2)]
    marker = str(tmp_path / "stuck")
    start = time.monotonic()
    refs, failed = prep.prepare_all(selected, limit_s=PREP_TEST_LIMIT_S,
                                    search=functools.partial(stuck_search, marker),
                                    wait=until_only_stuck_left(marker))
    assert time.monotonic() - start < PREP_TEST_LIMIT_S + 30  # killed, not waited for
    # the stuck worker was still running at the deadline: late, killed, its cases left
    assert "left to the ranks: gpt2/tp2/2r, llama/auto/2r\n" in capsys.readouterr().err
    assert not failed and set(refs) == {"gpt2", "opt", "llama"}
    assert refs["gpt2"]["graph"] is not None and refs["opt"]["graph"] is not None
    assert refs["llama"]["graph"] is None  # the ranks trace it
    plans = {arch: set(refs[arch]["plans"]) for arch in refs}
    assert plans == {"gpt2": {"gpt2/auto/2r"}, "opt": {"opt/auto/2r", "opt/tp2/2r"},
                     "llama": set()}
    assert all(len(refs[arch]["batches"]) == rm.STEPS for arch in refs)


@pytest.mark.timeout(60)
def test_the_prep_deadline_stops_waiting_at_its_limit():
    """`wait_for_workers`, the prep's own deadline: it returns at `limit_s` with a worker
    that never ends still running (`prepare_all` then kills it), and at once when all
    have exited."""
    import multiprocessing

    from dist_utils import start_method
    from real_models_prep import wait_for_workers

    context = multiprocessing.get_context(start_method())
    stuck = context.Process(target=time.sleep, args=(3600,), daemon=True)
    done = context.Process(target=time.sleep, args=(0,), daemon=True)
    stuck.start(), done.start()
    try:
        limit_s = 1.0
        start = time.monotonic()
        wait_for_workers([stuck, done], limit_s)
        waited_s = time.monotonic() - start
        assert limit_s <= waited_s < limit_s + 5, waited_s
        assert stuck.is_alive() and not done.is_alive()
    finally:
        stuck.kill()
        stuck.join()
    start = time.monotonic()
    wait_for_workers([stuck, done], 30.0)
    assert time.monotonic() - start < 5  # nothing left running: no wait


def fallback_case(case: Case, ref, rank: int, log) -> dict:
    """`run_case`'s planning with nothing prepared: every rank traces, rank 0 searches and
    broadcasts (`plan_case` with searched=None); each rank returns the plan it got."""
    try:
        text = rm.plan_case(case, rm.traced_graph(case.arch), 2, None)
        return {**ok(), "plan_json": text}
    except Exception as exc:
        return failed("crash", "plan", rm._first_line(exc))


@pytest.mark.timeout(240)
def test_an_unprepared_case_is_searched_by_rank_0_for_all():
    work = [(0, Case("gpt2", "tp2", 2), None)]
    outcome = run_group(2, work, case_fn=fallback_case)[0]
    assert outcome.status == PASS, outcome.reason
    from ir.plan import plan_from_dict

    doc = plan_from_dict(json.loads(outcome.plan_json), "<fallback plan>")
    assert {s.tp for s in doc.plan.layer_strategies} == {2}  # tp2's pin, searched


# ----------------------------------------------------------------------------- issue 14


_RUN: dict = {}  # the subset's outcomes, or the harness error: run once for all targets


def matrix_outcomes() -> tuple:
    """The subset's outcomes, then the falcon replays' (`falcon_replays`): one run, so the
    replays take the end of the subset's 4-rank group (and its falcon reference) instead
    of a group of their own."""
    if "result" not in _RUN:
        try:
            _RUN["result"] = tuple(run_matrix(SUBSET + falcon_replays()))
        except Exception as exc:
            _RUN["result"] = exc
    if isinstance(_RUN["result"], Exception):
        raise _RUN["result"]
    return _RUN["result"]


def subset_outcomes() -> tuple:
    return matrix_outcomes()[:len(SUBSET)]


@pytest.mark.timeout(480)
@pytest.mark.parametrize("target", TARGETS)
def test_issue_14_target(target: str):
    outcomes = list(subset_outcomes())
    bad = rm.target_failures(outcomes)[target]
    if bad:  # the table, not pytest's repr of the outcomes
        pytest.fail(f"{target}: missed by {len(bad)} of {len(outcomes)} runs\n"
                    f"{rm.format_cases(bad)}\n\n{rm.format_grid(outcomes)}", pytrace=False)


# ----------------------------------------------------------------------------- replays
# falcon/auto/4r was REJECTED once in the full matrix ("Could not resolve the process
# group registered under the name ..." at transformer.word_embeddings, tp=2) and passed
# alone. The 4-rank group runs its cases one after another, each in a fresh process
# group: a case whose embedding ran at tp 2 beside tp 1 layers (meshes for tp 1, then
# tp 2: sub-groups named 1.. and later) left DTensor's sharding cache holding its tp-2
# mesh; the next case, tp 2 only (fewer sub-groups), found that mesh in the cache (equal
# by ranks and axis names) with a sub-group name its own group never made. Both plans
# are ones the search proposes for falcon on 4 ranks as the measured speeds move.
FALCON_TP2_BESIDE_TP1 = (2, 2, 2, 1, 1)  # word_embeddings, h.0, h.1 | ln_f, lm_head
FALCON_TP2 = (2, 2, 2, 2, 2)


def falcon_replays() -> list[Case]:
    """The two plans in that order: the 4-rank group runs them one after the other, after
    the subset's 4-rank cases (`matrix_outcomes`)."""
    return [Case("falcon", "auto", 4, rm.layer_plan_json("falcon", 4, tps))
            for tps in (FALCON_TP2_BESIDE_TP1, FALCON_TP2)]


@pytest.mark.timeout(480)
def test_falcon_tp2_after_a_case_with_more_meshes():
    outcomes = matrix_outcomes()[len(SUBSET):]
    got = [(outcomes[i].status, outcomes[i].reason, outcomes[i].plan) for i in range(2)]
    assert [status for status, _, _ in got] == [PASS, PASS], got
    assert "L0-2 tp2·dp2 | L3-4 tp1·dp4" in got[0][2] and "L0-4 tp2·dp2" in got[1][2], got


def test_a_recorded_plan_replays():
    """A run's record carries its plan whole: `Case.parse(key, plan_json)` runs it again."""
    text = rm.layer_plan_json("falcon", 4, FALCON_TP2)
    case = Case.parse("falcon/auto/4r", text)
    assert (case.arch, case.mode, case.world, case.plan_json) == ("falcon", "auto", 4, text)
    outcome = rm.classify(case, [{**ok(), "plan_json": text}] * 2)
    assert outcome.to_dict()["plan_json"] == text and outcome.to_dict()["key"] == case.key
    with pytest.raises(ValueError, match="arch/mode/Nr"):
        Case.parse("falcon/auto/4")
