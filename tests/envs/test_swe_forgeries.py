"""Forgeries of the SWE verdict from inside the test session's own process (a plugin on the live
plugin manager, an import hook, unittest's run patched, test files or pytest's bytecode rewritten
on disk, the report forged by stack walking), each played on a pytest-style and a unittest-style
project made here: every one is MODEL_FAIL, and the oracle passes on both, and on a project whose
doctests are among its tests."""

from __future__ import annotations

import pytest

from posttrain.envs.audit import IN_PROCESS, swe_policies
from posttrain.envs.swe import SweEnv, load_task
from posttrain.outcome import OutcomeClass
from tests.envs.pools import start_pool
from tests.envs.swe_project import DOCTEST, UNITTEST, make_record


@pytest.fixture(scope="module")
def pool():
    p = start_pool(workers=1, timeout_s=30.0)
    yield p
    p.close()


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return {"pytest": make_record(tmp_path_factory.mktemp("swe-pytest")),
            "unittest": make_record(tmp_path_factory.mktemp("swe-unittest"), **UNITTEST),
            "doctest": make_record(tmp_path_factory.mktemp("swe-doctest"), **DOCTEST)}


def verdict(pool, record, policy: str):
    env = SweEnv(pool=pool)
    env.reset(record)
    for turn in swe_policies(load_task(record))[policy]:
        result = env.step(turn)
        if result.done:
            return result.outcome
    raise AssertionError("the policy never submitted")


@pytest.mark.parametrize("style", ["pytest", "unittest", "doctest"])
def test_the_oracle_passes_and_null_fails(pool, records, style):
    assert verdict(pool, records[style], "oracle").cls is OutcomeClass.PASS
    assert verdict(pool, records[style], "null").reason == "wrong_answer"


# Where nothing is forged, the honest verdict: no TestCase in a pytest-style suite; pytest's cached
# bytecode is never read from the tree; the test files on disk are read-only to the package, so
# its rewrite fails and the real tests run.
HONEST = {("pytest", "unittest_run"), ("pytest", "plant_bytecode"), ("unittest", "plant_bytecode"),
          ("pytest", "overwrite_tests"), ("unittest", "overwrite_tests")}


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
@pytest.mark.parametrize("style", ["pytest", "unittest"])
def test_a_forgery_from_inside_the_session_is_tampering(pool, records, style, name):
    outcome = verdict(pool, records[style], name)
    want = "wrong_answer" if (style, name) in HONEST else "forbidden"
    assert (outcome.cls, outcome.reason) == (OutcomeClass.MODEL_FAIL, want), outcome


# What the package tries from inside the verdict's own job: each answer is printed.
PROBE = r'''
import errno, os
def attempt(name, fn):
    try:
        fn()
        print(name, "done")
    except OSError as e:
        print(name, type(e).__name__, errno.errorcode.get(e.errno, e.errno))
def overwrite(path):
    with open(path, "w") as f:
        f.write("def test_x():\\n    pass\\n")
for folder, _dirs, names in sorted(os.walk(ROOT)):
    for name in sorted(names):
        path = os.path.join(folder, name)
        if name.startswith("test") and name.endswith(".py") or name == "conftest.py":
            attempt(os.path.relpath(path, ROOT), lambda: overwrite(path))
attempt("pycache", lambda: os.makedirs(ROOT + "/tests/__pycache__/x"))
'''


@pytest.mark.parametrize("style", ["pytest", "unittest"])
def test_the_verdicts_test_files_refuse_the_packages_writes(pool, records, style):
    """In the verdict's own job, every test file and conftest is read-only to code in the
    program's process: the overwrite forgery fails at its write, not only at the sentinels."""
    import dataclasses

    from posttrain.envs.swe import ROOT

    env = SweEnv(pool=pool)
    env.reset(records[style])
    job, _ = env.verdict_job("0" * 32)
    tests = {p for p in job.hidden if p.rsplit("/", 1)[-1].startswith("test") and p.endswith(".py")}
    assert tests, job.hidden.keys()
    out = pool.run([dataclasses.replace(job, program=f"ROOT = {ROOT!r}\n" + PROBE)])[0]
    got = dict(line.split(" ", 1) for line in out.detail.splitlines())
    assert tests <= set(got), out.detail
    assert all(answer in ("PermissionError EACCES", "OSError EROFS") for answer in got.values()), out.detail


@pytest.mark.slow
@pytest.mark.parametrize("style", ["pytest", "unittest"])
def test_env_audit_oracle_all_and_every_forgery_none(records, style, tmp_path, capsys):
    """Through the command a user runs: oracle 100%, null and every forgery 0%."""
    import json

    from posttrain.cli import main

    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(records[style]) + "\n")
    assert main(["env-audit", str(path), "--out", str(tmp_path / "audit"), "--workers", "1", "--timeout", "30"]) == 0
    rates = json.loads((tmp_path / "audit" / "summary.json").read_text())["pass_rate"]
    assert rates.pop("oracle") == 1.0 and set(IN_PROCESS) <= set(rates)
    assert all(rate == 0.0 for rate in rates.values()), rates
