"""Pass-rate store and curriculum: weights from pass rates, retirement and re-checks, resumable
draws, the plain shuffle when off, and a run that uses it (sync here; async shares the source)."""

import collections
import json

import pytest

from posttrain.config import load_config
from posttrain.outcome import Outcome
from posttrain.rl.config import RLConfig
from posttrain.rl.curriculum import CurriculumConfig, CurriculumSource, PassRateStore
from posttrain.rl.prompts import PromptSource

EXAMPLES = [{"prompt": f"p{i}", "answer": str(i)} for i in range(6)]


def _outcomes(passes: int, fails: int):
    return [Outcome.passed()] * passes + [Outcome.model_fail()] * fails


def _source(**cfg):
    return CurriculumSource(EXAMPLES, 0, CurriculumConfig(enabled=True, **cfg))


def test_store_keeps_a_window_and_skips_infra_failures():
    store = PassRateStore(2, window=4)
    store.observe(0, [True, False, True], clock=1)
    store.observe(0, [True, True], clock=2)
    assert store.recent[0] == [0, 1, 1, 1] and store.attempts[0] == 5 and store.passes[0] == 4
    src = _source(min_attempts=2)
    src.observe([1], [Outcome.passed(), Outcome.infra_fail("sandbox_down"), Outcome.model_fail()], group_size=3)
    assert src.store.recent[1] == [1, 0]


def test_weights_favour_intermediate_pass_rates_and_retire_solved():
    src = _source(min_attempts=4, solved_weight=0.0, unsolved_weight=0.1)
    src.observe([0, 1, 2, 3], _outcomes(4, 0) + _outcomes(0, 4) + _outcomes(2, 2) + _outcomes(1, 3), group_size=4)
    assert src.weight(0) == 0.0      # solved by every sample: retired
    assert src.weight(1) == 0.1      # solved by none
    assert src.weight(2) == 1.0      # p = 1/2: 4 p (1 - p)
    assert src.weight(3) == 0.75     # p = 1/4
    assert src.weight(4) == 1.0      # unseen
    src.observe([5], _outcomes(1, 1), group_size=2)
    assert src.weight(5) == 1.0      # too few attempts to judge yet


def test_draws_follow_the_weights():
    src = _source(recheck_every=0)
    src.observe([0, 1], _outcomes(4, 0) + _outcomes(0, 4), group_size=4)
    counts = collections.Counter(i for _ in range(400) for i, _ in src.next(2))
    assert counts[0] == 0                      # retired, never drawn
    assert counts[1] < counts[2] / 3           # rarely
    assert min(counts[i] for i in (2, 3, 4, 5)) > 100


def test_retired_prompts_come_back_for_a_recheck():
    src = _source(recheck_every=4)
    src.observe([0], _outcomes(4, 0), group_size=4)
    drawn = [i for _ in range(4) for i, _ in src.next(2)]
    assert drawn.count(0) == 2 and src.rechecks == 2   # one re-check per 4 draws
    src.observe([0], _outcomes(0, 4), group_size=4)     # forgotten: now half its window fails
    assert src.weight(0) == 1.0


def test_resumed_source_draws_what_the_uninterrupted_one_draws():
    a = _source()
    a.observe([0, 1], _outcomes(4, 0) + _outcomes(1, 3), group_size=4)
    a.next(3)
    b = _source()
    b.load_state_dict(a.state_dict())
    assert [i for i, _ in a.next(5)] == [i for i, _ in b.next(5)]


def test_off_means_the_plain_shuffle_and_metrics_still_flow():
    src = CurriculumSource(EXAMPLES, 3, CurriculumConfig())
    assert [i for i, _ in src.next(8)] == [i for i, _ in PromptSource(EXAMPLES, 3).next(8)]
    src.observe([0, 1], _outcomes(4, 0) + _outcomes(2, 2), group_size=4)
    m = src.metrics()
    assert m["curriculum/solve_all_frac"] == 0.5 and m["curriculum/solve_none_frac"] == 0.0
    plain = PromptSource(EXAMPLES, 3)
    src.load_state_dict(plain.state_dict())  # a checkpoint from before the store still loads


def test_config_checks():
    with pytest.raises(ValueError, match="must be <= window"):
        CurriculumConfig(window=2, min_attempts=3)


def test_a_run_with_the_curriculum_logs_it_and_checkpoints_the_store(rl_overrides, reward_plugin, tmp_path):
    from posttrain.rl.run import run_rl
    from posttrain.core.checkpoint import load_trainer_state

    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", num_steps=2,
                                                   **{"curriculum.enabled": True, "curriculum.min_attempts": 2}))
    run_rl(cfg, printer=lambda *_: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["curriculum/seen_frac"] > 0 and "curriculum/retired" in rows[-1]
    state = load_trainer_state(tmp_path / "run" / "checkpoints" / "step-2")
    assert sum(state["prompts"]["store"]["attempts"]) == 2 * 4 * 4
