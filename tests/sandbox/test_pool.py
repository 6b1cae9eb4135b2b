"""The pool: stdin/stdout judging, fault injection (workers killed mid-batch), retries, the circuit
breaker, canaries, recycling, back-pressure and the async API."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time

import pytest

from posttrain.outcome import OutcomeClass
from posttrain.sandbox import pool as pool_module
from posttrain.sandbox.pool import CircuitOpen, Job, normalize_output

DOUBLE = "def check(candidate):\n    for i in range(5):\n        assert candidate(i) == 2 * i\n"


def slow_double(right: bool, sleep_s: float = 0.05) -> Job:
    answer = "x * 2" if right else "x * 2 + 1"
    return Job(f"import time\ndef f(x):\n    time.sleep({sleep_s})\n    return {answer}\n", "f", DOUBLE)


def verdicts(outcomes):
    return [(o.cls.value, o.reason) for o in outcomes]


def test_io_tasks_compare_output_on_the_host(pool):
    echo = "import sys\nfor line in sys.stdin:\n    print(int(line) * 3)\n"
    cases = (("1\n2\n", "3\n6\n"), ("5", "15  \n\n"))
    got = pool.run([Job(echo, io=cases), Job(echo, io=(("1\n", "4\n"),)),
                    Job("raise ValueError('no')", io=cases), Job("import sys\nsys.exit(3)", io=cases),
                    Job("while True:\n    pass", io=cases, timeout_s=0.5)])
    assert verdicts(got) == [("PASS", ""), ("MODEL_FAIL", "wrong_answer"), ("MODEL_FAIL", "runtime_error"),
                             ("MODEL_FAIL", "runtime_error"), ("MODEL_FAIL", "timeout")]
    assert normalize_output("a  \nb\n\n\n") == normalize_output("\na\nb") == "a\nb"


def test_function_outcomes_and_reasons(pool):
    jobs = [Job("def f(x):\n    return x * 2\n", "f", DOUBLE),
            Job("def f(x):\n    raise KeyError(x)\n", "f", DOUBLE),
            Job("def f(x) return\n", "f", DOUBLE),
            Job("def g(x):\n    return x\n", "f", DOUBLE),
            Job("def f(x):\n    return x * 2\n", "f", "def check(candidate):\n    assert candidate(1) == 2\n",
                prelude="import nosuchmodule_xyz\n"),
            Job("def f(x):\n    return x * 2\n", "f", "def chekc(candidate):\n    pass\n")]
    assert verdicts(pool.run(jobs)) == [
        ("PASS", ""), ("MODEL_FAIL", "runtime_error"), ("MODEL_FAIL", "runtime_error"),
        ("MODEL_FAIL", "runtime_error"), ("TASK_FAIL", "bad_test"), ("TASK_FAIL", "bad_test")]


def test_tests_expecting_an_exception(pool):
    tests = ("def check(candidate):\n    try:\n        candidate(-1)\n    except ValueError:\n        pass\n"
             "    else:\n        raise AssertionError('no ValueError')\n")
    raises = Job("def f(x):\n    raise ValueError(x)\n", "f", tests)
    returns = Job("def f(x):\n    return x\n", "f", tests)
    assert verdicts(pool.run([raises, returns])) == [("PASS", ""), ("MODEL_FAIL", "wrong_answer")]


def _kill_workers(p, times: list[float], killed: list[int]) -> None:
    start = time.monotonic()
    for at in times:
        time.sleep(max(0.0, at - (time.monotonic() - start)))
        for w in list(p.workers):
            if w is not None and w.proc is not None:
                try:
                    os.killpg(w.proc.pid, signal.SIGKILL)
                    killed.append(w.proc.pid)
                except ProcessLookupError:
                    pass


def test_workers_killed_mid_batch_are_retried_with_the_same_verdicts(make_pool):
    jobs = [slow_double(i % 3 != 0, 0.02) for i in range(40)]
    want = [("PASS", "") if i % 3 else ("MODEL_FAIL", "wrong_answer") for i in range(40)]
    p = make_pool(workers=2, max_retries=3)
    try:
        p.run(jobs[:2])  # workers up
        killed: list[int] = []
        killer = threading.Thread(target=_kill_workers, args=(p, [0.15, 0.4], killed))
        killer.start()
        got = p.run(jobs)
        killer.join()
    finally:
        p.close()
    assert killed, "the fault was not injected"
    assert verdicts(got) == want
    assert p.stats["infra_errors"] >= 1 and p.stats["retries"] >= 1 and p.stats["infra_fail"] == 0


def test_without_retries_a_killed_worker_is_infra_fail_not_a_wrong_answer(make_pool):
    p = make_pool(workers=1, max_retries=0, breaker_threshold=1.0)
    try:
        p.run([slow_double(True)])
        fut = p.submit(slow_double(True, sleep_s=2.0))
        time.sleep(0.5)
        _kill_workers(p, [0.0], [])
        outcome, _ = fut.result()
        after = p.run([slow_double(True)])[0]  # a fresh sandbox takes over
    finally:
        p.close()
    assert outcome.cls is OutcomeClass.INFRA_FAIL and not outcome.is_reward
    assert after.cls is OutcomeClass.PASS and p.stats["started"] == 2


def test_circuit_breaker_stops_a_broken_host(make_pool):
    p = make_pool(workers=1, python="/nonexistent/python3", max_retries=2)
    try:
        futs = [p.submit(slow_double(True)) for _ in range(6)]
        done = [f.exception() or f.result()[0] for f in futs]
        assert isinstance(done[0], pool_module.Outcome) and done[0].cls is OutcomeClass.INFRA_FAIL
        assert "sandbox did not start" in done[0].detail
        assert isinstance(done[-1], CircuitOpen) and "circuit breaker open" in str(done[-1])
        with pytest.raises(CircuitOpen):
            p.submit(slow_double(True))
    finally:
        p.close()


def test_a_worker_failing_a_canary_is_replaced(make_pool, monkeypatch):
    wrong = [(name, job, ("MODEL_FAIL", "wrong_answer") if name == "pass" else want)
             for name, job, want in pool_module.CANARIES]
    p = make_pool(workers=1, max_retries=1, breaker_threshold=1.0)
    try:
        monkeypatch.setattr(pool_module, "CANARIES", wrong)
        outcome = p.run([slow_double(True)])[0]
        assert outcome.cls is OutcomeClass.INFRA_FAIL and "canary 'pass'" in outcome.detail
        assert p.stats["canary_failures"] == 2 and p.stats["started"] == 2
        monkeypatch.undo()
        assert p.run([slow_double(True)])[0].cls is OutcomeClass.PASS
    finally:
        p.close()


def test_recycling_and_periodic_canaries(make_pool):
    p = make_pool(workers=1, recycle_after=3, canary_every=2)
    try:
        got = p.run([slow_double(True, 0.0) for _ in range(10)])
    finally:
        p.close()
    assert all(o.cls is OutcomeClass.PASS for o in got)
    assert p.stats["recycled"] == 3 and p.stats["started"] == 4
    # One round at each start, and one before the 3rd program of each of the three full sandboxes.
    assert p.stats["canary_rounds"] == 4 + 3


def test_submit_blocks_when_the_queue_is_full(make_pool):
    p = make_pool(workers=1, queue_size=1)
    try:
        p.run([slow_double(True, 0.0)])
        first = p.submit(slow_double(True, sleep_s=0.25))  # five calls: over a second
        second = p.submit(slow_double(True, 0.0))  # fills the queue once the first is running
        third: list = []
        t = threading.Thread(target=lambda: third.append(p.submit(slow_double(True, 0.0))))
        t.start()
        time.sleep(0.4)
        assert t.is_alive(), "submit should wait while the queue is full"
        t.join(timeout=20)
        assert not t.is_alive()
        assert [f.result()[0].cls for f in (first, second, third[0])] == [OutcomeClass.PASS] * 3
    finally:
        p.close()


def test_async_api(pool):
    jobs = [slow_double(i % 2 == 0, 0.0) for i in range(6)]
    got = asyncio.run(pool.run_async(jobs))
    assert [o.cls.value for o in got] == ["PASS", "MODEL_FAIL"] * 3


def test_run_timed_reports_time_inside_the_sandbox(pool):
    (fast, t_fast), (slow, t_slow) = pool.run_timed([slow_double(True, 0.0), slow_double(True, 0.3)])
    assert fast.cls is slow.cls is OutcomeClass.PASS
    assert 0 < t_fast < t_slow and t_slow >= 5 * 0.3  # five calls of 0.3 s each


def test_state_left_by_a_tasks_tests_does_not_reach_the_next_task(pool):
    # One judge serves task after task; tests that patch a builtin, lower the recursion limit,
    # leave a thread running or arm a timer make it step down, so the next task meets a fresh one.
    program = "def f(x):\n    return x * 2\n"
    leave = ["import builtins\nbuiltins.abs = lambda x: 0\n",
             "import sys\nsys.setrecursionlimit(60)\n",
             "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
             "import signal\nsignal.alarm(1)\n"]
    probe = ("import signal, sys, threading\n"
             "def check(candidate):\n"
             "    assert abs(-2) == 2 and sys.getrecursionlimit() == 1000\n"
             "    assert threading.active_count() == 1 and signal.alarm(0) == 0\n"
             "    assert candidate(2) == 4\n")
    jobs = []
    for setup in leave:
        jobs += [Job(program, "f", setup + "def check(candidate):\n    assert candidate(2) == 4\n"),
                 Job(program, "f", probe)]
    assert verdicts(pool.run(jobs)) == [("PASS", "")] * len(jobs)


def test_zygote_compiles_its_source_where_the_interpreters_differ(make_pool, monkeypatch):
    # The host ships the zygote compiled; a sandbox interpreter of another version compiles the
    # source instead (here: the bootstrap is told the host is Python 0.0).
    from posttrain.sandbox import worker

    monkeypatch.setattr(worker, "BOOT", worker.BOOT.replace("{version}", "(0, 0)"))
    p = make_pool(workers=1)
    try:
        assert verdicts(p.run([slow_double(True, 0.0), slow_double(False, 0.0)])) == [
            ("PASS", ""), ("MODEL_FAIL", "wrong_answer")]
    finally:
        p.close()


def test_open_pools_never_share_a_uid_block(make_pool):
    """Sixteen blocks per process: an open pool's block is never handed to another (a shared uid
    shares RLIMIT_NPROC and lets one pool's programs signal the other's), the seventeenth open
    pool is refused, and a closed pool's block is free again."""
    held = set(pool_module._blocks_held)  # other open pools of this process
    opened = []
    try:
        with pytest.raises(RuntimeError, match="16 sandbox pools are already open"):
            for _ in range(17):
                opened.append(make_pool())
        bases = [p._uid_base for p in opened]
        assert len(bases) == 16 - len(held) and len(set(bases)) == len(bases) and not set(bases) & held
        freed = opened.pop()
        freed.close()
        opened.append(make_pool())
        assert opened[-1]._uid_base == freed._uid_base
    finally:
        for p in opened:
            p.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="running a process under another uid needs root")
def test_a_block_whose_uids_a_live_process_uses_is_skipped():
    """A pool of another process (whose pid matches ours modulo 30000) or a crash's leftovers."""
    base = pool_module._claim_uid_block(1)
    pool_module._release_uid_block(base)
    squatter = subprocess.Popen(["sleep", "60"], user=base + 1)
    try:
        deadline = time.monotonic() + 10
        while not pool_module.processes_by_uid(range(base + 1, base + 2)):  # until it runs as base + 1
            assert time.monotonic() < deadline, "the squatter never showed up under its uid"
            time.sleep(0.01)
        other = pool_module._claim_uid_block(1)
        assert other != base
        pool_module._release_uid_block(other)
    finally:
        squatter.kill()
        squatter.wait()
