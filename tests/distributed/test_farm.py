"""The verifier farm (sandbox pools as Ray actors) judges exactly like one in-process pool, and
survives its actors dying, breaking, timing out and failing canaries without a wrong verdict."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from posttrain.outcome import Outcome
from posttrain.sandbox.pool import Job, SandboxPool, SandboxUnavailable
from posttrain.sandbox.worker import SandboxConfig

CHECK = "def check(c):\n    assert c(2) == 3\n"
PYTEST = "from solution import f\n\ndef test_f():\n    assert f(2) == 3\n"
MIXED = [
    ("pass", Job("def f(x):\n    return x + 1\n", "f", CHECK)),
    ("wrong", Job("def f(x):\n    return x\n", "f", CHECK)),
    ("timeout", Job("def f(x):\n    while True:\n        pass\n", "f", CHECK, timeout_s=0.3)),
    ("memory", Job("def f(x):\n    return len(bytearray(1 << 40))\n", "f", CHECK)),
    ("syntax", Job("def f(x)\n    return x + 1\n", "f", CHECK)),
    ("runtime", Job("def f(x):\n    return 1 / 0\n", "f", CHECK)),
    ("io pass", Job("print(int(input()) * 2)\n", io=(("3\n", "6\n"), ("5\n", "10\n")))),
    ("io wrong", Job("print(int(input()) + 2)\n", io=(("3\n", "6\n"),))),
    ("pytest pass", Job("def f(x):\n    return x + 1\n", tests=PYTEST, module="solution")),
    ("pytest wrong", Job("def f(x):\n    return x\n", tests=PYTEST, module="solution")),
]
# Sleeps (not spins), so a batch is still running when a test kills or breaks its actor.
SLOW = [Job(f"import time\ndef f(x):\n    time.sleep(0.15)\n    return x + {k % 2}\n", "f", CHECK)
        for k in range(16)]
SLOW_TRUTH = [("PASS", "") if k % 2 else ("MODEL_FAIL", "wrong_answer") for k in range(16)]
CFG = SandboxConfig(replicas=2, cpus=2, timeout_s=2.0)


def verdicts(outcomes: list[Outcome]) -> list[tuple]:
    return [(o.cls.value, o.reason, o.reward) for o in outcomes]


def make_farm(**kwargs):
    from posttrain.distributed.farm import VerifierFarm

    try:
        return VerifierFarm(kwargs.pop("cfg", CFG), **kwargs)
    except SandboxUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def farm(ray_cluster):
    f = make_farm()
    yield f
    f.close()


def test_farm_outcomes_equal_the_in_process_pool(farm):
    jobs = [job for _, job in MIXED] * 3
    with SandboxPool(dataclasses.replace(CFG, workers=2, replicas=0)) as pool:
        local = pool.run(jobs)
    remote = farm.run(jobs)
    assert [v[:2] for v in verdicts(local[:len(MIXED)])] == [
        ("PASS", ""), ("MODEL_FAIL", "wrong_answer"), ("MODEL_FAIL", "timeout"), ("MODEL_FAIL", "memory"),
        ("MODEL_FAIL", "runtime_error"), ("MODEL_FAIL", "runtime_error"), ("PASS", ""), ("MODEL_FAIL", "wrong_answer"),
        ("PASS", ""), ("MODEL_FAIL", "wrong_answer")]
    assert verdicts(remote) == verdicts(local)
    stats = farm.stats
    assert stats["requests"] < len(jobs), "programs go to actors in batches, not one call each"
    assert len(farm._pool_stats) == 2, "both actors judged programs"
    assert stats["retries"] == stats["infra_fail"] == 0


def test_submit_returns_a_future_of_outcome_and_time(farm):
    outcome, time_s = farm.submit(MIXED[0][1]).result(timeout=60)
    assert outcome.cls.value == "PASS" and time_s > 0


def test_a_callers_time_on_the_farm_is_charged_to_its_pool_clock(farm):
    from posttrain.sandbox.clock import PoolClock, charged_to

    clock = PoolClock()
    with charged_to(clock):
        futures = [farm.submit(job) for job in SLOW[:4]]
    for f in futures:
        f.result(timeout=60)
    assert clock.seconds() >= 0.15


def test_actor_killed_mid_batch_programs_judged_elsewhere_once(ray_cluster):
    farm = make_farm()
    try:
        results: list = []
        runner = threading.Thread(target=lambda: results.append(farm.run(SLOW)))
        runner.start()
        victim = farm.actors[0]
        deadline = time.monotonic() + 30
        while victim.inflight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # a batch is inside the victim's sandboxes now
        ray_cluster.kill(victim.handle, no_restart=True)
        runner.join(timeout=120)
        assert [(o.cls.value, o.reason) for o in results[0]] == SLOW_TRUTH
        stats = farm.stats
        assert stats["actor_deaths"] == 1 and stats["actors_replaced"] == 1 and stats["retries"] >= 1
        assert stats["programs"] == len(SLOW) and stats["infra_fail"] == 0
        assert victim not in farm.actors and len(farm.actors) == 2 and farm.actors[-1].name == "sandbox-2"
        assert verdicts(farm.run([job for _, job in MIXED[:2]]))[0][0] == "PASS"  # the replacement serves
    finally:
        farm.close()


def _broken_after_start(victim: str):
    """An actor class whose pool, on the actor named ``victim``, breaks after its canaries passed:
    every sandbox it starts from then on fails to start (WorkerError), so its programs end INFRA_FAIL."""
    from posttrain.distributed.farm import SandboxActor

    class BrokenAfterStart(SandboxActor):
        def ready(self):
            info = super().ready()
            if self.name == victim:
                self.pool.cfg = dataclasses.replace(self.pool.cfg, python="/nonexistent/python3")
                for slot in range(len(self.pool.workers)):
                    self.pool._drop(slot)
            return info

    return BrokenAfterStart


@pytest.mark.parametrize("threshold, counter", [(1.0, "retries"), (0.5, "breaker_trips")])
def test_infra_fail_on_one_actor_is_retried_on_another(ray_cluster, threshold, counter):
    """threshold 1.0: the broken pool never trips and returns INFRA_FAIL, which the farm sends to
    the other actor. 0.5: the pool's breaker opens, and the farm drains and replaces the actor."""
    cfg = dataclasses.replace(CFG, breaker_threshold=threshold, max_retries=1)
    farm = make_farm(cfg=cfg, actor_class=_broken_after_start("sandbox-0"))
    try:
        got = farm.run(SLOW)
        assert [(o.cls.value, o.reason) for o in got] == SLOW_TRUTH
        stats = farm.stats
        assert stats[counter] >= 1 and stats["infra_fail"] == 0 and stats["programs"] == len(SLOW)
        if counter == "retries":  # the broken pool answered, so its counters reached the farm
            assert stats["pool/infra_errors"] >= 1 and "sandbox-0" in farm._pool_stats
    finally:
        farm.close()


def _stalls_then_fails_canaries():
    """sandbox-0 never answers a request; its replacement (sandbox-2) gets a canary wrong."""
    from posttrain.distributed.farm import SandboxActor

    class Faulty(SandboxActor):
        def ready(self):
            info = super().ready()
            return {**info, "wrong": ["pass gave MODEL_FAIL/wrong_answer"]} if self.name == "sandbox-2" else info

        def run(self, jobs):
            if self.name == "sandbox-0":
                time.sleep(3600)
            return super().run(jobs)

    return Faulty


def test_silent_actor_times_out_and_a_replacement_failing_canaries_is_replaced(ray_cluster):
    farm = make_farm(actor_class=_stalls_then_fails_canaries(), request_timeout_s=2.0)
    try:
        got = farm.run(SLOW[:8])
        assert [(o.cls.value, o.reason) for o in got] == SLOW_TRUTH[:8]
        deadline = time.monotonic() + 60  # replacements start while the other actor works
        while not any(a.ready for a in farm.actors if a.name == "sandbox-3") and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = farm.stats
        assert stats["timeouts"] == 1 and stats["canary_failures"] == 1 and stats["start_failures"] == 1
        assert sorted(a.name for a in farm.actors) == ["sandbox-1", "sandbox-3"]
    finally:
        farm.close()


def test_a_program_that_breaks_every_actor_ends_infra_fail_not_wrong(ray_cluster):
    """Retries are bounded: with every actor broken the program is INFRA_FAIL (masked), never reward 0
    from a wrong verdict; the pools' breakers stay shut (threshold 1.0) so the farm does not trip."""
    cfg = dataclasses.replace(CFG, replicas=1, breaker_threshold=1.0, max_retries=1)
    from posttrain.distributed.farm import SandboxActor

    class AllBroken(SandboxActor):
        def ready(self):
            info = super().ready()
            self.pool.cfg = dataclasses.replace(self.pool.cfg, python="/nonexistent/python3")
            for slot in range(len(self.pool.workers)):
                self.pool._drop(slot)
            return info

    farm = make_farm(cfg=cfg, actor_class=AllBroken)
    try:
        (outcome,) = farm.run([MIXED[0][1]])
        assert outcome.cls.value == "INFRA_FAIL" and "sandbox-0" in outcome.detail
        assert farm.stats["infra_fail"] == 1 and farm.stats["retries"] == 1
    finally:
        farm.close()


def test_code_verifier_through_the_farm_gives_the_in_process_rewards(ray_cluster):
    from posttrain.distributed.cluster import RayConfig
    from posttrain.verifiers import code

    example = {"tests": "def check(c):\n    assert c(2) == 4\n    assert c(5) == 10\n", "entry_point": "double"}
    completions = ["```python\ndef double(x):\n    return 2 * x\n```", "def double(x):\n    return x + 2\n",
                   "```python\ndef double(x):\n    while True: pass\n```", "no code at all", "```\n```"]
    examples = [example] * len(completions)
    try:
        code.configure(SandboxConfig(workers=2, timeout_s=0.5))
        local = code.verify_batch(completions, examples)
        code.configure(SandboxConfig(replicas=2, cpus=1, timeout_s=0.5), "ray", RayConfig())
        remote = code.verify_batch(completions, examples)
        assert type(code.shared_pool()).__name__ == "VerifierFarm"
    finally:
        code.configure(SandboxConfig())
    assert [o.reward for o in local] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert verdicts(remote) == verdicts(local)


def test_a_farm_whose_actors_fail_their_canaries_does_not_start(ray_cluster):
    from posttrain.distributed.farm import VerifierFarm

    broken = dataclasses.replace(CFG, replicas=1, python="/nonexistent/python3", max_retries=0)
    named = r"sandbox actor sandbox-0 on .*: canaries failed: pass gave INFRA_FAIL"
    with pytest.raises(SandboxUnavailable, match=named):
        VerifierFarm(broken, start_timeout_s=60)
