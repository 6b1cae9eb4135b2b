"""Watchdog: each warning fires once, when its condition is met, and only then."""

from posttrain.rl.diagnostics import Watchdog


def _run(watchdog, rows):
    for step, m in enumerate(rows, 1):
        watchdog.check(step, m)


def test_entropy_collapse_warns_once():
    said = []
    _run(Watchdog(said.append), [{"entropy": 1.0}, {"entropy": 0.5}, {"entropy": 0.04}, {"entropy": 0.01}])
    assert len(said) == 1 and "entropy_collapse" in said[0] and "step 3" in said[0]


def test_a_start_below_the_entropy_floor_warns_only_on_a_tenfold_drop():
    """A well-trained SFT start can sit below the absolute floor (0.05) from step 1: sharpening it
    by a quarter is not a collapse; falling to a tenth of where it started is."""
    said = []
    _run(Watchdog(said.append), [{"entropy": 0.04}, {"entropy": 0.035}, {"entropy": 0.03}])
    assert said == []
    _run(Watchdog(said.append), [{"entropy": 0.04}, {"entropy": 0.03}, {"entropy": 0.0035}])
    assert len(said) == 1 and "entropy_collapse" in said[0] and "step 3" in said[0]


def test_mismatch_jump_against_its_median():
    said = []
    _run(Watchdog(said.append), [{"mismatch/kl": 1e-4}] * 4 + [{"mismatch/kl": 5e-4}, {"mismatch/kl": 5e-3}])
    assert len(said) == 1 and "mismatch_jump" in said[0] and "step 6" in said[0]


def test_all_zero_variance_warns_unless_switched_off():
    said = []
    _run(Watchdog(said.append), [{"groups/zero_variance_frac": 0.5}, {"groups/zero_variance_frac": 1.0}] * 2)
    assert len(said) == 1 and "all_zero_variance" in said[0] and "step 2" in said[0]
    quiet = []
    _run(Watchdog(quiet.append, zero_variance_warning=False), [{"groups/zero_variance_frac": 1.0}])
    assert quiet == []


def test_lengths_count_the_models_tokens_not_the_environments():
    from posttrain.outcome import Outcome
    from posttrain.rl.diagnostics import rollout_metrics
    from posttrain.rollout import Rollouts, SamplingParams

    ro = Rollouts(prompt_idx=[0, 0], prompt_ids=[[1], [1]], completion_ids=[[5, 6, 7, 8, 9], [5, 6, 7, 8]],
                  logprobs=[[0.0] * 5, [0.0] * 4], finish_reason=["eos", "eos"], policy_version=[0, 0],
                  sampling=SamplingParams(), loss_mask=[[1, 1, 0, 0, 1], [1, 0, 0, 0]])
    m = rollout_metrics(ro, [Outcome.model_fail(reward=0.0)] * 2, 0.0)
    assert m["response_length/mean"] == 2.0 and m["response_length/max"] == 3 and m["tokens/env"] == 5
    assert ro.model_tokens() == [3, 1]


def test_outcome_fractions_and_the_reasons_of_every_failing_class():
    from posttrain.outcome import Outcome
    from posttrain.rl.diagnostics import rollout_metrics
    from posttrain.rollout import Rollouts, SamplingParams

    outcomes = [Outcome.passed(), Outcome.model_fail("wrong_answer"), Outcome.model_fail("wrong_answer"),
                Outcome.model_fail("max_turns"), Outcome.infra_fail("env_timeout", "hung"),
                Outcome.infra_fail("env_timeout", "hung"), Outcome.infra_fail("env_error", "raised"),
                Outcome.task_fail("bad_test", "broken")]
    n = len(outcomes)
    ro = Rollouts(prompt_idx=[0] * n, prompt_ids=[[1]] * n, completion_ids=[[5]] * n, logprobs=[[0.0]] * n,
                  finish_reason=["eos"] * n, policy_version=[0] * n, sampling=SamplingParams())
    m = rollout_metrics(ro, outcomes, 0.0)
    assert {k: v for k, v in m.items() if k.startswith("outcomes/")} == {
        "outcomes/PASS_frac": 1 / 8, "outcomes/MODEL_FAIL_frac": 3 / 8, "outcomes/TASK_FAIL_frac": 1 / 8,
        "outcomes/INFRA_FAIL_frac": 3 / 8, "outcomes/MODEL_FAIL/wrong_answer_frac": 2 / 8,
        "outcomes/MODEL_FAIL/max_turns_frac": 1 / 8, "outcomes/INFRA_FAIL/env_timeout_frac": 2 / 8,
        "outcomes/INFRA_FAIL/env_error_frac": 1 / 8, "outcomes/TASK_FAIL/bad_test_frac": 1 / 8}
