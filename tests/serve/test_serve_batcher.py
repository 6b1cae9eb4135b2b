"""`EngineWorker`'s grouping rules, with a fake engine that records its calls."""

from __future__ import annotations

import asyncio
import threading

from posttrain.rollout import Rollouts, SamplingParams
from posttrain.serve.batcher import EngineWorker


class FakeEngine:
    def __init__(self):
        self.calls = []
        self.version = 0
        self.threads = set()

    def generate(self, prompts, n, sampling):
        self.threads.add(threading.get_ident())
        self.calls.append((len(prompts), n, sampling.seed, sampling.max_new_tokens))
        rows = [i for i in range(len(prompts)) for _ in range(n)]
        return Rollouts(prompt_idx=rows, prompt_ids=[prompts[i] for i in rows],
                        completion_ids=[[prompts[i][0], self.version] for i in rows], logprobs=[[0.0, 0.0]] * len(rows),
                        finish_reason=["length"] * len(rows), policy_version=[self.version] * len(rows),
                        sampling=sampling)


def run_together(worker, jobs):
    """Submit every job at once; jobs are (prompts, n, SamplingParams) or a callable (control job)."""

    async def main():
        worker.start()
        try:
            return await asyncio.gather(*(worker.call(j) if callable(j) else worker.generate(*j) for j in jobs))
        finally:
            await asyncio.to_thread(worker.stop)

    return asyncio.run(main())


def test_grouping_follows_seed_semantics():
    engine = FakeEngine()
    greedy = [([[i, 1]], 2, SamplingParams(temperature=0.0, max_new_tokens=4, seed=i)) for i in range(3)]
    seeded = [([[10 + i]], 1, SamplingParams(temperature=1.0, max_new_tokens=4, seed=7 + i)) for i in range(2)]
    unseeded = [([[20 + i], [30 + i]], 1, SamplingParams(temperature=1.0, max_new_tokens=4)) for i in range(3)]
    longer = [([[40]], 1, SamplingParams(temperature=1.0, max_new_tokens=8))]
    results = run_together(EngineWorker(engine, batch_wait_s=0.05), greedy + seeded + unseeded + longer)
    calls = sorted(engine.calls, key=repr)
    # greedy x3 share a call (seeds dropped), each seeded request alone with its own seed,
    # unseeded x3 (6 prompts) share one, the max_tokens=8 one apart
    assert calls == sorted([(3, 2, None, 4), (1, 1, 7, 4), (1, 1, 8, 4), (6, 1, None, 4), (1, 1, None, 8)], key=repr)
    for (prompts, n, _), r in zip(greedy + seeded + unseeded + longer, results):
        assert r.prompt_ids == [p for p in prompts for _ in range(n)]  # each request gets its own rows back
        assert r.prompt_idx == [i for i in range(len(prompts)) for _ in range(n)]
    assert len(engine.threads) == 1


def test_batch_seeded_merges_seeded_requests():
    engine = FakeEngine()
    seeded = [([[10 + i]], 1, SamplingParams(temperature=1.0, max_new_tokens=4, seed=7 + i)) for i in range(3)]
    run_together(EngineWorker(engine, batch_wait_s=0.05, batch_seeded=True), seeded)
    assert len(engine.calls) == 1 and engine.calls[0][0] == 3 and engine.calls[0][2] is not None


def test_control_job_runs_after_the_generations_before_it():
    engine = FakeEngine()

    def bump(e):
        e.version = 5
        return "done"

    jobs = [([[1]], 1, SamplingParams(temperature=0.0)), ([[2]], 1, SamplingParams(temperature=0.0)), bump,
            ([[3]], 1, SamplingParams(temperature=0.0))]
    before1, before2, result, after = run_together(EngineWorker(engine, batch_wait_s=0.05), jobs)
    assert result == "done"
    assert before1.policy_version == before2.policy_version == [0] and after.policy_version == [5]
    assert [c[0] for c in engine.calls] == [2, 1]


def test_max_batch_prompts_splits_rounds():
    engine = FakeEngine()
    jobs = [([[i], [i + 1]], 1, SamplingParams(temperature=0.0)) for i in range(5)]
    run_together(EngineWorker(engine, batch_wait_s=0.05, max_batch_prompts=4), jobs)
    assert sum(c[0] for c in engine.calls) == 10 and max(c[0] for c in engine.calls) <= 4
