"""Watchdog: each warning fires once, when its condition is met, and only then."""

import dataclasses

from posttrain.rl.diagnostics import Watchdog


def _run(watchdog, rows):
    for step, m in enumerate(rows, 1):
        watchdog.check(step, m)


def test_entropy_collapse_warns_once_when_the_recent_median_falls_to_a_tenth_of_the_start():
    """Start: median(1.0, 0.9, 1.1) = 1.0. Step 4: median(0.9, 1.1, 0.05) = 0.9; step 5:
    median(1.1, 0.05, 0.05) = 0.05 < 0.1 -> warns at step 5, once."""
    said = []
    _run(Watchdog(said.append), [{"entropy": e} for e in (1.0, 0.9, 1.1, 0.05, 0.05, 0.01, 0.01)])
    assert len(said) == 1 and "entropy_collapse" in said[0] and "step 5" in said[0]
    assert "0.0500" in said[0] and "1.0000" in said[0]


def test_a_low_entropy_start_that_sharpens_is_not_a_collapse():
    """A solid SFT start sits at 0.03-0.06 nats/token from step 1 (docs/study.md): falling by half
    over a short run is sharpening. An absolute floor (0.05) would have warned at step 2."""
    said = []
    _run(Watchdog(said.append), [{"entropy": e} for e in (0.06, 0.04, 0.05, 0.035, 0.03, 0.025, 0.02)])
    assert said == []


def test_one_low_step_neither_sets_the_start_nor_warns():
    """A first step that reads low (a batch of all-solved groups) does not define the start, and a
    single dip later is outvoted by its neighbours."""
    said = []
    _run(Watchdog(said.append), [{"entropy": e} for e in (0.001, 0.5, 0.5, 0.5, 0.01, 0.5, 0.5)])
    assert said == []


def test_a_low_start_still_warns_on_a_tenfold_fall():
    said = []
    _run(Watchdog(said.append), [{"entropy": e} for e in (0.04, 0.04, 0.04, 0.003, 0.003)])
    assert len(said) == 1 and "step 5" in said[0]


def test_a_short_run_never_warns_before_its_start_is_measured():
    said = []
    _run(Watchdog(said.append), [{"entropy": e} for e in (1.0, 0.001, 0.001)])
    assert said == []


def test_ungraded_samples_warn_with_their_reasons_instead_of_too_easy_or_too_hard():
    """A judge that grades nothing: every sample INFRA_FAIL (masked), so every group is also
    zero-variance; the warning names the reason, and the zero-variance one (which blames the
    prompts) stays quiet."""
    m = {"groups/zero_variance_frac": 1.0, "outcomes/INFRA_FAIL_frac": 1.0, "outcomes/PASS_frac": 0.0,
         "outcomes/INFRA_FAIL/judge_unparseable_frac": 0.75, "outcomes/INFRA_FAIL/judge_timeout_frac": 0.25}
    said = []
    _run(Watchdog(said.append), [m, m])
    assert len(said) == 1 and "[ungraded] step 1: 100% of samples were not graded" in said[0]
    assert "INFRA_FAIL/judge_unparseable 75%, INFRA_FAIL/judge_timeout 25%" in said[0]
    assert "too easy" not in said[0]


def test_ungraded_counts_task_fail_too_and_a_minority_does_not_warn():
    said = []
    few = {"outcomes/INFRA_FAIL_frac": 0.25, "outcomes/INFRA_FAIL/sandbox_error_frac": 0.25}
    _run(Watchdog(said.append), [few, few])
    assert said == []
    half = {"outcomes/INFRA_FAIL_frac": 0.25, "outcomes/TASK_FAIL_frac": 0.25,
            "outcomes/TASK_FAIL/bad_test_frac": 0.25, "outcomes/INFRA_FAIL/sandbox_error_frac": 0.25}
    _run(Watchdog(said.append), [few, half])
    assert len(said) == 1 and "step 2: 50%" in said[0] and "TASK_FAIL/bad_test 25%" in said[0]


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


def test_a_held_out_eval_mostly_ungraded_is_marked_with_its_reasons():
    """What `held_out_eval` logs when the judge answered nothing usable for 3 of 4 samples."""
    from posttrain.outcome import Outcome, ungraded_fracs
    from posttrain.verifiers.evaluate import EvalSummary, eval_metrics

    outcomes = [Outcome.infra_fail("judge_unparseable")] * 2 + [Outcome.task_fail("bad_test"), Outcome.passed()]
    fracs = ungraded_fracs(outcomes)
    assert fracs == {"INFRA_FAIL/judge_unparseable": 0.5, "TASK_FAIL/bad_test": 0.25}
    summary = EvalSummary(profile="greedy", n=1, pass_at_k={1: 0.25}, ci={1: (0.0, 0.75)}, passes_per_problem=[],
                          outcome_counts={}, mean_length=3.0, solve_all_frac=0.25, solve_none_frac=0.75,
                          ungraded=fracs)
    m = eval_metrics(summary, "heldout")
    assert m["eval/heldout/greedy/ungraded_frac"] == 0.75
    assert m["eval/heldout/greedy/ungraded/INFRA_FAIL/judge_unparseable_frac"] == 0.5
    said = []
    _run(Watchdog(said.append), [{}, m, m])
    assert len(said) == 1 and "[eval_ungraded eval/heldout/greedy] step 2: 75% of the held-out samples" in said[0]
    assert "INFRA_FAIL/judge_unparseable 50%, TASK_FAIL/bad_test 25%" in said[0] and "pass@1 0.250" in said[0]
    quiet = []
    _run(Watchdog(quiet.append), [eval_metrics(dataclasses.replace(summary, ungraded={"TASK_FAIL/bad_test": 0.25}),
                                               "heldout")])
    assert quiet == []


def test_samples_are_each_groups_best_then_worst_group_by_group():
    """Rewards per group (G=4): g0 = .2 .9 .5 .1, g1 = 1 1 0 INFRA_FAIL, g2 = .3 .3 .3 .3. Best is
    the highest reward (ties to the earlier sample), worst the lowest, a masked outcome below every
    reward; past two a group, the second best and second worst of each group follow."""
    from posttrain.outcome import Outcome
    from posttrain.rl.diagnostics import picked_episodes

    fail = Outcome.model_fail
    outcomes = [fail(reward=r) for r in (0.2, 0.9, 0.5, 0.1)] + [
        Outcome.passed(), Outcome.passed(), fail(reward=0.0), Outcome.infra_fail("sandbox_died")] + [
        fail(reward=0.3)] * 4
    assert picked_episodes(outcomes, 4, 4) == [1, 3, 4, 7]
    assert picked_episodes(outcomes, 4, 7) == [1, 3, 4, 7, 8, 11, 2]
    assert picked_episodes(outcomes, 4, 12) == [1, 3, 4, 7, 8, 11, 2, 0, 5, 6, 9, 10]
    assert picked_episodes(outcomes, 4, 1) == [1] and picked_episodes(outcomes, 4, 0) == []
