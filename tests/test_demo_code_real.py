"""The real-model code demo: the reuse of the start's greedy samples across seeds (keyed by the
weights' bytes and the evaluation's settings; an evaluation fed them generates nothing), and its arms
(one RL stage and one evaluation with the arm as a parameter, the reasoning start, bad --arms)."""

import argparse
import dataclasses
from pathlib import Path

import pytest

from posttrain.demo import code_real
from posttrain.demo.code_real import kept_start_eval, reuse_samples
from posttrain.errors import UserError
from posttrain.eval.runner import _load_engine, run_eval
from tests.eval.test_runner import CountingEngine, config


def test_the_key_follows_the_weights_bytes_and_the_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    start = tmp_path / "start"
    start.mkdir()
    (start / "model.safetensors").write_bytes(b"\0" * 100)
    (start / "config.json").write_text("{}")
    cfg = config(start, tmp_path / "out", 'benchmarks=[{"kind": "arithmetic", "num_problems": 3}]')
    key = kept_start_eval(cfg, str(start))
    assert key.parent == tmp_path / "cache" / "start-evals" and kept_start_eval(cfg, str(start)) == key
    (start / "config.json").write_text('{"other": 1}')  # not the weights: same key
    assert kept_start_eval(cfg, str(start)) == key
    longer = dataclasses.replace(cfg, profiles=[dataclasses.replace(cfg.profiles[0], max_new_tokens=7)])
    assert kept_start_eval(longer, str(start)) != key
    (start / "model.safetensors").write_bytes(b"\0" * 99 + b"\1")
    assert kept_start_eval(cfg, str(start)) != key


def test_an_evaluation_given_the_kept_samples_generates_nothing_and_gives_the_same_result(tmp_path, capsys):
    from posttrain.models.tiny import build_tiny

    nano = build_tiny(tmp_path / "model", size="nano")
    overrides = ('benchmarks=[{"kind": "arithmetic", "num_problems": 5}]',
                 'profiles=[{"name": "greedy", "max_new_tokens": 4}]')
    engine, tokenizer = _load_engine(str(nano), config(nano, tmp_path))
    first = CountingEngine(engine)
    before = run_eval(config(nano, tmp_path / "seed0", *overrides), engine=first, tokenizer=tokenizer,
                      show_progress=False)
    reuse_samples(tmp_path / "seed0", tmp_path / "kept")
    reuse_samples(tmp_path / "kept", tmp_path / "seed1", say=True)
    assert "arithmetic.greedy.jsonl: the start's greedy samples from" in capsys.readouterr().out
    second = CountingEngine(engine)
    again = run_eval(config(nano, tmp_path / "seed1", *overrides), engine=second, tokenizer=tokenizer,
                     show_progress=False)
    assert first.prompts == 5 and second.prompts == 0 and again[0].per_problem == before[0].per_problem
    # a longer samples file where it is copied to is kept
    (tmp_path / "seed1" / "samples" / "arithmetic.greedy.jsonl").write_text("x" * 10**6)
    reuse_samples(tmp_path / "kept", tmp_path / "seed1")
    assert (tmp_path / "seed1" / "samples" / "arithmetic.greedy.jsonl").stat().st_size == 10**6


def _real_args(tmp_path, **kw):
    return argparse.Namespace(**{"out": str(tmp_path / "out"), "model": "smollm2", "profile": "full", "seed": 3,
                                 "seeds": None, "no_progress": True, "arms": "direct,reasoning", **kw})


def test_both_arms_are_one_rl_stage_with_the_same_overrides_but_recipe_and_tokens(tmp_path, monkeypatch):
    from posttrain.rl import run as rl_run

    configs = []
    monkeypatch.setattr(rl_run, "run_rl", configs.append)
    p = code_real.settings("full", ("direct", "reasoning"), False)
    paths = {"train": str(tmp_path / "train.jsonl")}
    for arm in ("direct", "reasoning"):
        code_real.stage_rl(tmp_path, p, paths, str(tmp_path / f"start-{arm}"), code_real.ARMS[arm], _real_args(tmp_path))
    direct, reasoning = configs
    assert (direct.algorithm, reasoning.algorithm) == ("grpo", "dr_grpo")
    assert (reasoning.format_weight, reasoning.format_reward) == (0.05, "code_format")
    # the recipe's thinking prompts are kept (SmolLM2's template renders them as the direct prompt)
    assert (direct.data.thinking, reasoning.data.thinking) == (False, True)
    assert (direct.rollout.max_new_tokens, reasoning.rollout.max_new_tokens) == (128, 160)
    for cfg, arm in ((direct, "direct"), (reasoning, "reasoning")):
        assert cfg.model.path == str(tmp_path / f"start-{arm}") and cfg.out_dir == str(tmp_path / arm)
        assert (cfg.data.path, cfg.rollout.backend, cfg.model.device) == (paths["train"], "torch", "cpu")
        assert (cfg.num_steps, cfg.prompts_per_step, cfg.rollout.group_size, cfg.optim.lr) == (12, 8, 8, 1e-4)
        assert (cfg.micro_batch_tokens, cfg.seed, cfg.model.lora.r) == (2048, 3, 32)


def test_the_reasoning_arm_is_evaluated_thinking_at_t06_one_sample_from_its_trace_sft_start(tmp_path, monkeypatch):
    from posttrain.eval import runner

    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    configs = []

    def fake_eval(cfg, show_progress):  # what an evaluation leaves: its samples
        configs.append(cfg)
        (Path(cfg.out_dir) / "samples").mkdir(parents=True)
        (Path(cfg.out_dir) / "samples" / "humaneval.jsonl").write_text("{}\n")

    monkeypatch.setattr(runner, "run_eval", fake_eval)
    p = code_real.settings("full", ("direct", "reasoning"), False)
    start = str(tmp_path / "sft-reasoning" / "checkpoints" / "step-40")
    code_real.evaluate(tmp_path, p, start, code_real.ARMS["reasoning"], 3)
    before, after = configs
    assert (before.model, after.model) == (start, str(tmp_path / "reasoning"))
    assert before.out_dir == str(tmp_path / "reasoning" / "evals" / "before")
    for cfg in configs:
        (profile,) = cfg.profiles
        assert cfg.thinking and (profile.temperature, profile.n, profile.max_new_tokens) == (0.6, 1, 192)
        assert [b.name for b in cfg.benchmarks] == ["humaneval", "humaneval_plus", "mbpp", "mbpp_plus"]
    # a sampled start draws other samples under each seed: kept for the next seed only when greedy
    code_real.evaluate(tmp_path, p, start, code_real.ARMS["direct"], 3)
    direct = configs[2]
    assert not direct.thinking and (direct.profiles[0].name, direct.profiles[0].temperature) == ("greedy", 0.0)
    assert kept_start_eval(direct, start).is_dir() and not kept_start_eval(before, start).exists()


def test_the_reasoning_start_is_the_trace_sft_the_bench_measured(tmp_path):
    p = code_real.settings("full", ("direct", "reasoning"), False)
    cfg = code_real.trace_sft_config("m", tmp_path / "traces.jsonl", tmp_path / "sft", steps=p["trace_sft_steps"],
                                     tokens=p["trace_sft_tokens"], lr=p["trace_sft_lr"], warmup=p["trace_sft_warmup"],
                                     seed=0, extra=["save_every=0"])
    assert (cfg.num_steps, cfg.data.tokens_per_batch, cfg.optim.lr, cfg.optim.warmup_steps) == (40, 2048, 1e-5, 2)
    assert cfg.optim.schedule == "constant" and not cfg.model.lora.enabled  # a full fine-tune
    assert code_real.settings("quick", ("reasoning",), False)["trace_sft_steps"] == 2
    # a direct-only run's settings are the profile's as they were: a --seeds folder's seeds.json still matches
    assert code_real.settings("full", ("direct",), True) == code_real.PROFILES["full"] | {"progress": True}


@pytest.mark.parametrize("text, message", [("", "separated by commas"), ("direct,,reasoning", "separated by commas"),
                                           ("direct,thinking", "unknown arm 'thinking'"),
                                           ("reasoning,reasoning", "given twice")])
def test_bad_arms_are_refused(text, message):
    with pytest.raises(UserError, match=message):
        code_real.parse_arms(text)


def test_arms_are_run_in_the_tables_order_and_bad_ones_exit_2_before_anything_runs(tmp_path, capsys, monkeypatch):
    from posttrain.cli import main
    from posttrain.demo.seeds import check_settings

    assert code_real.parse_arms(None) == ("direct",) and code_real.parse_arms(" reasoning,direct") == ("direct", "reasoning")
    monkeypatch.setattr(code_real, "prepare", lambda *a: pytest.fail("the demo started"))
    out = tmp_path / "out"
    demo = ["demo", "--task", "code", "--out", str(out)]
    assert main(demo + ["--model", "smollm2", "--arms", "direct,bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown arm 'bogus'" in err and not out.exists()
    assert main(demo + ["--arms", "reasoning"]) == 2  # the miniature runs both arms
    assert "only the real-model demo" in capsys.readouterr().err and not out.exists()
    # a --seeds folder of direct-only seeds is refused the reasoning arm: one table, one experiment
    check_settings(out / "seeds.json", {"model": "smollm2", "profile": code_real.settings("quick", ("direct",), True)}, 0)
    assert main(demo + ["--model", "smollm2", "--profile", "quick", "--arms", "direct,reasoning", "--seeds", "0"]) == 2
    assert "differing: arms, reasoning_tokens" in capsys.readouterr().err
