"""The pool clock: a caller's time on the sandbox pool, which a hang deadline over it leaves out."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

from posttrain.sandbox.clock import PoolClock, charge, charged_to
from posttrain.sandbox.pool import Job


def test_overlapping_jobs_count_once_and_the_clock_stops_with_the_last():
    clock, a, b = PoolClock(), Future(), Future()
    with charged_to(clock):
        charge(a)
        time.sleep(0.05)
        charge(b)
    charge(Future())  # outside the context: charged to nobody
    time.sleep(0.05)
    a.set_result(None)
    time.sleep(0.05)
    b.set_result(None)
    held = clock.seconds()
    assert 0.15 <= held < 0.5  # 0.15 s with a job on the pool, not 0.25 s of job-seconds
    time.sleep(0.05)
    assert clock.seconds() == held


def test_a_pool_charges_a_job_from_submit_to_its_verdict(pool):
    clock = PoolClock()
    with charged_to(clock):
        fut = pool.submit(Job("import time\ndef f():\n    time.sleep(0.3)\n", "f", "def check(c):\n    c()\n"))
    fut.result()
    assert 0.3 <= clock.seconds() < 2.0


def test_a_closed_pool_refuses_a_job_rather_than_leave_its_caller_waiting(make_pool):
    p = make_pool()
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.submit(Job("def f():\n    return 1\n", "f", "def check(c):\n    c()\n"))
