"""The sync RL loop on the nano model: gradients, learning, masking, metrics, resume, bad input."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from posttrain.config import load_config
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import rl_step, setup
from posttrain.rl.run import run_rl
from posttrain.tracking import StageTimer

DESIGN_METRICS = ("step", "time/step_s", "time/rollout_s", "time/update_s", "reward/mean", "kl/ref", "entropy",
                  "response_length/mean", "groups/zero_variance_frac", "mismatch/kl",
                  "mismatch/logprob_abs_diff_max", "outcomes/PASS_frac", "outcomes/MODEL_FAIL_frac",
                  "outcomes/INFRA_FAIL_frac", "outcomes/TASK_FAIL_frac")


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_zero_variance_groups_produce_no_gradient(rl_overrides, reward_plugin):
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:constant", **{"optim.lr": 0.1,
                                                   "optim.weight_decay": 0.0}))
    run = setup(cfg)
    before = _params(run.policy.model)
    m = rl_step(run, 1, StageTimer())
    assert m["groups/zero_variance_frac"] == 1.0 and m["adv/abs_mean"] == 0.0
    assert m["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, run.policy.model.parameters()))


def test_informative_groups_do_move_the_weights(rl_overrides, reward_plugin):
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters"))
    run = setup(cfg)
    before = _params(run.policy.model)
    m = rl_step(run, 1, StageTimer())
    assert m["groups/zero_variance_frac"] < 1.0 and m["grad_norm"] > 0
    assert not all(torch.equal(a, b) for a, b in zip(before, run.policy.model.parameters()))
    assert run.engine.version == 1  # the update reached the engine


def test_sampler_and_trainer_agree_in_fp32(rl_overrides, reward_plugin):
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters"))
    m = rl_step(setup(cfg), 1, StageTimer())
    assert m["mismatch/logprob_abs_diff_max"] < 1e-4
    assert abs(m["mismatch/kl"]) < 1e-6


def _count_backward_rows(run) -> list[int]:
    """Rows of each policy forward whose log-probs the backward reaches."""
    seen, target_logits = [], run.policy._target_logits

    def counting(*args):
        t = target_logits(*args)
        if t.logits_BXV.requires_grad:  # a packed forward holds its rows in one sequence
            rows = t.packed or t.logits_BXV.shape[0]
            t.logits_BXV.register_hook(lambda grad: seen.append(rows))
        return t

    run.policy._target_logits = counting
    return seen


@pytest.mark.parametrize("extra", [{}, {"kl.coef": 0.1, "kl.mode": "reward"}, {"mini_batches": 2}])
def test_zero_variance_rows_skip_the_backward_and_take_the_same_step(rl_overrides, reward_plugin, extra):
    """Odd answers give flat groups: their rows are not differentiated, and the step equals the one
    that differentiates every row (same rollouts, loss, gradient norm and weights). The scoring
    diagnostics are the same where the reference forward ran (step 1); on step 2 a flat group is
    scored by its first sample (`score_weights`, tested in tests/rl/test_policy_skip.py)."""
    steps = {}
    for skip in (True, False):
        run = setup(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:half_flat", **{
            "optim.lr": 1e-2, "optim.eps": 1e-5, "skip_zero_variance_backward": skip, **extra})))
        seen = _count_backward_rows(run)
        metrics = [rl_step(run, step, StageTimer()) for step in (1, 2)]
        steps[skip] = metrics, seen, _params(run.policy.model)
    (on, seen_on, w_on), (off, seen_off, w_off) = steps[True], steps[False]
    for a, b in zip(on, off):
        assert a["reward/mean"] == b["reward/mean"]  # the same rollouts
        assert 0 < a["groups/zero_variance_frac"] < 1
        exact = ("loss", "grad_norm", "adv/abs_mean") + (("entropy", "mismatch/kl") if "kl/ref" in b else ())
        for key in exact:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    assert "kl/ref" in on[0]  # step 1 always runs the reference forward: the diagnostics compared exactly
    informative = sum(round(16 * (1 - m["groups/zero_variance_frac"])) for m in on)
    assert sum(seen_off) == 2 * 16 and sum(seen_on) == informative
    for a, b in zip(w_on, w_off):  # Adam: rounding of near-zero gradients (8 rows summed vs 16) moves ~1e-6
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_kl_in_the_loss_differentiates_every_row(rl_overrides, reward_plugin):
    """The KL term is not multiplied by the advantage: flat groups still have a gradient."""
    run = setup(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:half_flat", **{"kl.coef": 0.1})))
    seen = _count_backward_rows(run)
    m = rl_step(run, 1, StageTimer())
    assert 0 < m["groups/zero_variance_frac"] < 1 and sum(seen) == 16


def test_crashing_verifier_is_masked_and_counted_not_scored_zero(rl_overrides, reward_plugin):
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:flaky"))
    run = setup(cfg)
    m = rl_step(run, 1, StageTimer())
    assert 0 < m["outcomes/INFRA_FAIL_frac"] < 1
    assert m["outcomes/INFRA_FAIL_frac"] + m["outcomes/MODEL_FAIL_frac"] == pytest.approx(1.0)


def test_dynamic_sampling_gives_up_with_a_reason_when_no_group_is_informative(rl_overrides, reward_plugin):
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:constant", **{
        "dynamic_sampling.enabled": True, "dynamic_sampling.max_rounds": 2}))
    m = rl_step(setup(cfg), 1, StageTimer())
    assert m["dynamic_sampling/rounds"] == 2 and m["dynamic_sampling/starved"] == 1
    assert m["update/skipped"] == 1


def test_dynamic_sampling_logs_the_reward_of_every_first_round_group(rl_overrides, reward_plugin):
    # Nothing is kept (every group scores 0.5), yet the first round's reward is still reported.
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:constant", **{
        "dynamic_sampling.enabled": True, "dynamic_sampling.max_rounds": 2}))
    m = rl_step(setup(cfg), 1, StageTimer())
    assert m["dynamic_sampling/sampled_reward_mean"] == 0.5
    # The first round is the step's plain sample: its reward is what a run without dynamic sampling logs.
    on, off = ({"dynamic_sampling.enabled": flag, "dynamic_sampling.max_rounds": 3} for flag in (True, False))
    m_on = rl_step(setup(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **on))),
                   1, StageTimer())
    m_off = rl_step(setup(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **off))),
                    1, StageTimer())
    assert m_on["dynamic_sampling/sampled_reward_mean"] == pytest.approx(m_off["reward/mean"])


@pytest.mark.parametrize("algorithm", ["grpo", *(pytest.param(a, marks=pytest.mark.slow)
                                                for a in ("dr_grpo", "rloo", "reinforce_pp"))])
def test_grpo_family_improves_reward_on_an_easy_task(rl_overrides, reward_plugin, algorithm, tmp_path):
    cfg = load_config(RLConfig, None, rl_overrides(
        verifier=f"{reward_plugin}:letters", algorithm=algorithm, num_steps=10, mini_batches=2, **{
            "optim.lr": 2e-2, "rollout.group_size": 8, "prompts_per_step": 4, "kl.track": False}))
    run_rl(cfg)
    rewards = [m["reward/mean"] for m in _metrics(tmp_path / "run")]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:2]) / 2 + 0.1, rewards


def _samples(run_dir):
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_metrics_carry_the_contract_names_and_resume_continues(rl_overrides, reward_plugin, arith_data_dir, tmp_path):
    """Also samples.jsonl, at the default of 4 a step: each step's best and worst of groups 0 and
    1, with the reward the verifier gives the text written. The resume is from step 1 (step 2's
    checkpoint removed, as if the run were killed while saving it): the killed run's step-2 lines
    of metrics.jsonl and samples.jsonl are replaced by the resumed run's, not kept beside them."""
    import rl_test_rewards

    prompts = [json.loads(line)["prompt"] for line in (arith_data_dir / "prompts_train.jsonl").read_text().splitlines()]
    over = rl_overrides(verifier=f"{reward_plugin}:letters", save_every=1, **{"kl.track_every": 2})
    run_rl(load_config(RLConfig, None, over))
    first = _metrics(tmp_path / "run")
    assert [m["step"] for m in first] == [1, 2]
    for name in DESIGN_METRICS:
        assert name in first[-1], name
    assert (tmp_path / "run" / "config.yaml").is_file()
    samples = _samples(tmp_path / "run")
    assert [(s["step"], s["group"]) for s in samples] == [(1, 0), (1, 0), (1, 1), (1, 1)] + [(2, 0), (2, 0), (2, 1),
                                                                                               (2, 1)]
    for s in samples:
        judged = rl_test_rewards.letters(s["completion"], {})
        assert (s["reward"], s["outcome"], s["reason"]) == (judged.reward, judged.cls.value, judged.reason), s
        assert s["policy_version"] == s["step"] - 1 and s["completion_tokens"] <= 8
        assert s["finish_reason"] in ("eos", "length") and (s["finish_reason"] == "eos" or s["completion_tokens"] == 8)
    for best, worst in zip(samples[::2], samples[1::2]):
        assert best["reward"] >= worst["reward"] and best["sample"] != worst["sample"]
        assert best["prompt"] == worst["prompt"] and any(p in best["prompt"] for p in prompts)
    assert samples[0]["prompt"] != samples[2]["prompt"]
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-2")
    run_rl(load_config(RLConfig, None, over + ["num_steps=3"]))
    resumed = _metrics(tmp_path / "run")
    assert [m["step"] for m in resumed] == [1, 2, 3]
    assert resumed[2]["policy_version"] == 3
    assert (tmp_path / "run" / "checkpoints" / "step-3" / "config.json").is_file()
    again = _samples(tmp_path / "run")
    assert [s["step"] for s in again] == [1] * 4 + [2] * 4 + [3] * 4
    assert again[:4] == samples[:4]


def test_lora_policy_trains_and_syncs_merged_weights(rl_overrides, reward_plugin):
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **{
        "model.lora.enabled": True, "model.lora.r": 4, "optim.lr": 1e-2}))
    run = setup(cfg)
    m = rl_step(run, 1, StageTimer())
    assert m["grad_norm"] > 0 and run.engine.version == 1
    # engine now holds the merged weights: sampler and trainer still agree
    m2 = rl_step(run, 2, StageTimer())
    assert m2["mismatch/logprob_abs_diff_max"] < 1e-4


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_lora_dropout_leaves_the_on_policy_ratio_at_one(rl_overrides, reward_plugin, algorithm):
    """Old and new log-probs must come from one function: with dropout on in the update only, the
    PPO ratio of an on-policy step is not 1. (LoRA's B starts at 0, so step 2 is the one to check.)"""
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", algorithm=algorithm, **{
        "model.lora.enabled": True, "model.lora.r": 4, "model.lora.dropout": 0.1, "optim.lr": 1e-2,
        "kl.track": False, "rollout.max_new_tokens": 12}))
    run = setup(cfg)
    rl_step(run, 1, StageTimer())
    m = rl_step(run, 2, StageTimer())
    assert m["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5) and m["policy/clip_frac"] == 0.0


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", "rl", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def test_example_recipe_with_user_prompts_and_math_verifier(nano_model_dir, tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a}+{a}?", "answer": str(2 * a)}) + "\n"
                            for a in range(6)))
    r = _cli("examples/grpo_arith.yaml", f"model.path={nano_model_dir}", f"data.path={data}", "data.eval_path=",
             "verifier=math", "rollout.group_size=2", "rollout.max_new_tokens=4", "rollout.temperature=1.0",
             "prompts_per_step=2", "num_steps=1", f"out_dir={tmp_path / 'out'}", "logging.progress=false")
    assert r.returncode == 0, r.stderr
    m = _metrics(tmp_path / "out")
    assert m[-1]["step"] == 1 and "time/step_s" in m[-1]


def _main(capsys, *args) -> tuple[int, str]:
    """``posttrain rl ARGS`` in this process (a fresh interpreter costs seconds a call, most of the
    time of these refusals): the exit code and what went to stderr."""
    from posttrain.cli import main

    capsys.readouterr()
    code = main(["rl", *map(str, args)])
    return code, capsys.readouterr().err


def test_bad_input_from_a_fresh_interpreter_is_one_line_exit_2(nano_model_dir, arith_data_dir, tmp_path):
    """What a user's shell sees, import-time warnings included: the one line and nothing else."""
    out = tmp_path / "never"
    r = _cli("examples/grpo_arith.yaml", f"model.path={nano_model_dir}",
             f"data.path={arith_data_dir / 'prompts_train.jsonl'}", "data.eval_path=", f"out_dir={out}",
             "rollout.group_sise=4")
    assert r.returncode == 2, r.stderr
    assert "group_sise" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("override, needle", [
    ("rollout.group_sise=4", "group_sise"),
    ("rollout.group_size=four", "rollout.group_size"),
    ("algorithm=ppo2", "algorithm"),
    ("logging.samples_per_step=-1", "logging.samples_per_step"),
    ("data.path=/nonexistent/p.jsonl", "/nonexistent/p.jsonl"),
    ("eval_samples=4", "eval_samples"),  # several greedy samples are one sample
    ("eval_temperature=-1", "eval_temperature"),
    ("data.eval_name=held out", "data.eval_name"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(nano_model_dir, arith_data_dir, tmp_path, override, needle,
                                                         capsys):
    out = tmp_path / "never"
    code, err = _main(capsys, "examples/grpo_arith.yaml", f"model.path={nano_model_dir}",
                      f"data.path={arith_data_dir / 'prompts_train.jsonl'}", "data.eval_path=", f"out_dir={out}",
                      override)
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_k1_in_the_loss_is_refused_with_the_reason(nano_model_dir, arith_data_dir, tmp_path, capsys):
    out = tmp_path / "never"
    code, err = _main(capsys, "examples/grpo_arith.yaml", f"model.path={nano_model_dir}",
                      f"data.path={arith_data_dir / 'prompts_train.jsonl'}", "data.eval_path=", f"out_dir={out}",
                      "kl.coef=0.05", "kl.mode=loss", "kl.estimator=k1")
    assert code == 2, err
    assert "kl.estimator" in err and "zero expected gradient" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert load_config(RLConfig, None, ["kl.coef=0.05", "kl.mode=reward", "kl.estimator=k1"]).kl.estimator == "k1"


def test_sampled_held_out_eval_names_its_set_and_profile_and_repeats_its_draw(rl_overrides, reward_plugin,
                                                                               arith_data_dir):
    """eval_samples=4 at T = 1 on a named set: pass@1, 2, 4 under eval/<name>/t1/; the samples of one
    prompt differ (pass@4 above pass@1, where greedy's four copies would tie them); and two evaluations
    of the same weights give the same figures, as each draws with the run's seed."""
    from posttrain.rl.loop import held_out_eval

    def run_with(**extra):
        return setup(load_config(RLConfig, None, rl_overrides(
            verifier=f"{reward_plugin}:even_length", **{"data.eval_path": arith_data_dir / "prompts_train.jsonl",
                                                        "data.eval_max_prompts": 8, **extra})))

    sampled = run_with(eval_samples=4, eval_temperature=1.0, **{"data.eval_name": "train_fixed"})
    first, again = held_out_eval(sampled), held_out_eval(sampled)
    assert first == again
    head = "eval/train_fixed/t1"
    assert {f"{head}/pass@{k}" for k in (1, 2, 4)} <= first.keys()
    assert first[f"{head}/pass@4"] > first[f"{head}/pass@1"] > 0
    greedy = held_out_eval(run_with())
    assert {k.rsplit("/", 1)[0] for k in greedy} == {"eval/heldout/greedy"} and "eval/heldout/greedy/pass@1" in greedy


def test_malformed_prompt_row_names_file_and_line(nano_model_dir, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": \n')
    code, err = _main(capsys, "examples/grpo_arith.yaml", f"model.path={nano_model_dir}", f"data.path={data}",
                      "data.eval_path=", f"out_dir={tmp_path / 'never'}")
    assert code == 2 and f"{data}:2" in err


def test_tracked_kl_runs_the_reference_on_a_sample_of_steps(rl_overrides, reward_plugin, tmp_path):
    """kl.coef=0: the reference forward (and `kl/ref`) on step 1 and every `kl.track_every` steps;
    with kl.coef > 0 on every step, since the loss needs it."""
    run_rl(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", num_steps=4,
                                                    **{"kl.track_every": 3})))
    assert ["kl/ref" in m for m in _metrics(tmp_path / "run")] == [True, False, True, False]
    run_rl(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", num_steps=2,
                                                    out_dir=tmp_path / "coef", **{"kl.coef": 0.1,
                                                                                  "logging.samples_per_step": 0})))
    assert all("kl/ref" in m for m in _metrics(tmp_path / "coef"))
    assert (tmp_path / "run" / "samples.jsonl").is_file() and not (tmp_path / "coef" / "samples.jsonl").exists()


SANDBOXED = '''
from posttrain.verifiers import code

TESTS = {"tests": "def check(c):\\n    assert c() == 1\\n", "entry_point": "f"}


def program(completion):
    return f"def f():\\n    return {len(completion) % 2}\\n"


def by_length(completion, example):
    return code.verify(program(completion), TESTS)


by_length.batch = lambda cs, es: code.verify_batch([program(c) for c in cs], [TESTS] * len(cs))
'''


def test_code_rewards_on_the_verifier_farm_equal_the_local_run(rl_overrides, tmp_path, monkeypatch, ray_cluster):
    """runtime=ray with sandbox.replicas=2: the recipe's programs are judged on sandbox actors and
    every step's rewards equal the local run's (a reward that passes in the sandbox by completion length)."""
    from posttrain.sandbox.worker import probe
    from posttrain.verifiers import code

    if not (probe()["bwrap"] and probe()["root"]):
        pytest.skip("no sandbox here")
    (tmp_path / "rl_sandboxed.py").write_text(SANDBOXED)
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = {}
    for where, extra in (("local", {}), ("farm", {"runtime": "ray", "sandbox.replicas": 2, "sandbox.cpus": 1})):
        run_rl(load_config(RLConfig, None, rl_overrides(verifier="rl_sandboxed:by_length", out_dir=tmp_path / where,
                                                        **{"sandbox.timeout_s": 2, **extra})))
        rows = _metrics(tmp_path / where)
        runs[where] = [(m["reward/mean"], m["outcomes/PASS_frac"]) for m in rows]
        assert ("farm/requests" in rows[-1] and rows[-1]["farm/actor_deaths"] == 0) == (where == "farm")
        assert type(code.shared_pool()).__name__ == ("VerifierFarm" if where == "farm" else "SandboxPool")
    code.configure(code.SandboxConfig())
    assert runs["farm"] == runs["local"]
    assert any(0 < frac < 1 for _, frac in runs["local"]), "the sandbox judged some programs each way"


def test_resumed_token_count_is_rank_zeros_read_broadcast(tmp_path, monkeypatch):
    """Only rank 0 reads metrics.jsonl (which it alone rewrites on resume); every other rank takes
    its count, so all ranks stop a token budget at the same step."""
    import types

    from posttrain.rl import loop

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "tokens/generated": 30}\n{"step": 2, "tokens/generated": 12}\n')
    sent = []

    def world(main: bool):
        return types.SimpleNamespace(main=main, broadcast_object=lambda obj, src=0: sent.append(obj) or 42)

    rank0 = types.SimpleNamespace(run_dir=tmp_path, world=world(True))
    assert loop.tokens_so_far(rank0, start=2) == 42 and sent == [42]  # rank 0 read 42 and sent it
    monkeypatch.setattr(loop, "read_metrics", lambda *_: pytest.fail("a rank other than 0 read metrics.jsonl"))
    rank1 = types.SimpleNamespace(run_dir=tmp_path, world=world(False))
    assert loop.tokens_so_far(rank1, start=2) == 42
    assert loop.tokens_so_far(rank1, start=0) == 0


@pytest.mark.parametrize("extra", [[], ["env.name=calculator"]])
def test_a_tokenizer_without_a_chat_template_is_one_line_exit_2_and_writes_nothing(nano_model_dir, arith_data_dir,
                                                                                    tmp_path, capsys, extra):
    import shutil

    from posttrain.cli import main

    model = tmp_path / "no-template"
    shutil.copytree(nano_model_dir, model)
    (model / "chat_template.jinja").unlink()
    out = tmp_path / "run"
    code = main(["rl", f"model.path={model}", f"data.path={arith_data_dir / 'prompts_train.jsonl'}",
                 f"out_dir={out}", "num_steps=1", "logging.progress=false", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no chat template" in err[0] and str(model) in err[0], err
    assert not (out / "config.yaml").exists() and not (out / "metrics.jsonl").exists()


def test_environments_refuse_plain_prompts(nano_model_dir, arith_data_dir, tmp_path):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="data.use_chat_template"):
        load_config(RLConfig, None, [f"model.path={nano_model_dir}", f"data.path={arith_data_dir}/prompts_train.jsonl",
                                     "env.name=calculator", "data.use_chat_template=false"])


def test_an_error_on_rank_0_reaches_every_rank_as_itself_or_as_its_message():
    """`share_step` under torchrun: what rank 0's work raises is broadcast and raised on every rank
    (the others would wait in the next collective forever); an error that does not pickle arrives
    as its type and message, an engine error stays an `EngineError` (the ranks checkpoint on it)."""
    import threading
    import types

    from posttrain.errors import UserError
    from posttrain.rl.loop import share_step
    from posttrain.rollout.protocol import EngineError

    sent = []

    def world(main: bool):
        def broadcast_object(obj):
            if main:
                sent.append(obj)
                return obj
            return sent[-1]
        return types.SimpleNamespace(main=main, distributed=True, broadcast_object=broadcast_object)

    class Unpicklable(EngineError):
        def __init__(self, msg):
            super().__init__(msg)
            self.lock = threading.Lock()

    def fail(error):
        def make():
            raise error
        return make

    for error, kind in ((UserError("bad"), UserError), (Unpicklable("engine gone"), EngineError),
                        (ValueError("x"), ValueError)):
        for main in (True, False):
            with pytest.raises(kind, match=str(error)):
                share_step(types.SimpleNamespace(world=world(main)), fail(error))
    assert share_step(types.SimpleNamespace(world=world(True)), lambda: 7) == 7
    assert share_step(types.SimpleNamespace(world=world(False)), lambda: 0) == 7
