"""One sandbox: which CPU it is pinned to, seen from inside by a program."""

from __future__ import annotations

import ast
import os

import pytest

from posttrain.sandbox.pool import Job
from posttrain.sandbox.worker import SandboxConfig

AFFINITY = Job("import os\nprint(sorted(os.sched_getaffinity(0)))\n", io=(("", ""),))


def test_cpu_of_pins_round_robin_only_when_the_sandboxes_fill_the_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {7, 2, 5})
    assert [SandboxConfig(workers=3).cpu_of(s) for s in range(3)] == [2, 5, 7]
    assert [SandboxConfig(workers=5).cpu_of(s) for s in range(5)] == [2, 5, 7, 2, 5]
    assert SandboxConfig(workers=2).cpu_of(0) is None  # a CPU to spare: spread out instead
    assert SandboxConfig(workers=3, pin_cpus=False).cpu_of(0) is None


def _affinity_inside(pool, slot: int) -> list[int]:
    worker = pool._ready_worker(slot)
    reply = worker.run(AFFINITY.request(pool.cfg))
    return ast.literal_eval(reply["cases"][0]["stdout"])


def test_every_program_runs_on_its_sandboxs_cpu(make_pool):
    cpus = sorted(os.sched_getaffinity(0))
    pool = make_pool(workers=len(cpus))
    try:
        for slot in range(len(cpus)):
            for _ in range(2):  # the pre-forked candidate of a later program inherits it too
                assert _affinity_inside(pool, slot) == [cpus[slot]]
    finally:
        pool.close()
    pool = make_pool(workers=len(cpus), pin_cpus=False)
    try:
        assert _affinity_inside(pool, 0) == cpus
    finally:
        pool.close()


def test_fewer_sandboxes_than_cpus_are_not_pinned(make_pool):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    pool = make_pool(workers=1)
    try:
        assert _affinity_inside(pool, 0) == cpus
    finally:
        pool.close()
