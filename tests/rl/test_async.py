"""Async RL: K=0 equals sync, the staleness bound under a randomly slow engine, correction refusal,
weight-sync verification, the start-up self-test, and hang/death handling of the engine process."""

import contextlib
import dataclasses
import json
import os
import random
import signal
import time
import types

import pytest
import torch

from posttrain.cli import main
from posttrain.config import load_config
from posttrain.outcome import Outcome
from posttrain.rl.async_ import worker
from posttrain.rl.async_.controller import AsyncController
from posttrain.rollout.protocol import EngineDied, EngineTimeout, Generated
from posttrain.rl.async_.selftest import SelfTestError, self_test
from posttrain.rl.async_.worker import LocalEngine, ProcessEngine
from posttrain.rl.config import RLConfig
from posttrain.rl.curriculum import CurriculumSource
from posttrain.rl.loop import setup
from posttrain.rl.run import run_rl
from posttrain.rollout import SamplingParams, WeightSyncError, weights_checksum
from posttrain.rollout.types import Rollouts


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _comparable(row):
    # is/truncated_frac: sync truncates its importance weights; async's default applies none (its
    # ratio is taken against the sampler), so it has no truncation to report. The largest
    # sampler/trainer difference is float32 rounding (~5e-7), which the engine process's own
    # kernels round otherwise: rounded to 1e-6 here, so that the comparison is of real mismatch.
    out = {k: v for k, v in row.items() if not k.startswith(("time/", "async/", "selftest/"))
           and k not in ("tokens_per_s", "is/truncated_frac")}
    if "mismatch/logprob_abs_diff_max" in out:
        out["mismatch/logprob_abs_diff_max"] = round(out["mismatch/logprob_abs_diff_max"], 5)
    return out


@pytest.mark.slow
def test_k0_reproduces_sync_step_for_step(rl_overrides, reward_plugin, arith_data_dir, tmp_path):
    common = dict(verifier=f"{reward_plugin}:letters", num_steps=3, **{"data.eval_path": arith_data_dir / "prompts_eval.jsonl",
                  "data.eval_max_prompts": 8})
    run_rl(load_config(RLConfig, None, rl_overrides(out_dir=tmp_path / "sync", **common)), printer=lambda *_: None)
    run_rl(load_config(RLConfig, None, rl_overrides(out_dir=tmp_path / "async", mode="async", max_staleness=0, **common)),
           printer=lambda *_: None)
    sync, asyn = _rows(tmp_path / "sync"), _rows(tmp_path / "async")
    assert [r["step"] for r in sync] == [r["step"] for r in asyn] == [0, 1, 2, 3]
    assert any(r.get("grad_norm", 0) > 0 for r in sync), "the runs must actually learn for the comparison to mean anything"
    for s, a in zip(sync, asyn):
        assert _comparable(s) == pytest.approx(_comparable(a), rel=1e-5, abs=1e-7)
    assert all(r["async/staleness_max"] == 0 for r in asyn[1:])
    assert asyn[0]["selftest/passed"] == 1


def test_async_ppo_k0_reproduces_sync_ppo_step_for_step(rl_overrides, reward_plugin, tmp_path):
    """PPO through the async driver (critic, GAE, the shared learn): K = 0 is the sync run."""
    common = dict(verifier=f"{reward_plugin}:letters", algorithm="ppo", num_steps=2, ppo_epochs=2, mini_batches=2,
                  **{"kl.coef": 0.05, "kl.mode": "reward", "critic.optim.lr": 3e-3, "asynchrony.self_test": False})
    run_rl(load_config(RLConfig, None, rl_overrides(out_dir=tmp_path / "sync", **common)), printer=lambda *_: None)
    run_rl(load_config(RLConfig, None, rl_overrides(out_dir=tmp_path / "async", mode="async", max_staleness=0,
                                                    **common)), printer=lambda *_: None)
    sync, asyn = _rows(tmp_path / "sync"), _rows(tmp_path / "async")
    assert [r["step"] for r in sync] == [r["step"] for r in asyn] == [1, 2]
    assert all(r["critic/grad_norm"] > 0 and r["grad_norm"] > 0 for r in sync)
    for s, a in zip(sync, asyn):
        assert _comparable(s) == pytest.approx(_comparable(a), rel=1e-5, abs=1e-7)
    # the async driver writes samples.jsonl through the same learn: the same rollouts, as text
    samples = [(tmp_path / run / "samples.jsonl").read_text().splitlines() for run in ("sync", "async")]
    assert len(samples[0]) == 8 and samples[0] == samples[1]


# ------------------------------------------------------------------------------------- property test


class SlowEngine:
    """A fake engine with the real one's ordering (FIFO messages) but a random pace: each poll serves
    a random number of queued messages, so generation runs ahead or lags the trainer at random."""

    def __init__(self, rng: random.Random):
        self.rng, self.queue, self.ready = rng, [], []
        self.version = self.served = self.rid = self.polls = 0
        self.restarts, self.idle_s = 0, 0.0

    def submit(self, prompts, n, sampling):
        self.rid += 1
        self.queue.append(("g", self.rid, prompts, n, sampling))
        return self.rid

    def load_weights(self, weights, version, checksum):
        self.version = version
        self.queue.append(("w", version))

    def _serve_one(self):
        msg = self.queue.pop(0)
        if msg[0] == "w":
            self.served = msg[1]
            return
        _, rid, prompts, n, sampling = msg
        texts = [self.rng.choice(["yes", "no"]) for _ in range(len(prompts) * n)]
        self.ready.append(Generated(rid=rid, gen_s=0.0, idle_s=0.0, rollouts=Rollouts(
            prompt_idx=[i for i in range(len(prompts)) for _ in range(n)], prompt_ids=[p for p in prompts for _ in range(n)],
            completion_ids=[[5, 6]] * len(texts), logprobs=[[-0.5, -0.5]] * len(texts), finish_reason=["eos"] * len(texts),
            policy_version=[self.served] * len(texts), sampling=sampling, texts=texts)))

    def poll(self, wait):
        self.polls += 1
        for _ in range(self.rng.randint(0, 3)):
            if self.queue:
                self._serve_one()
        while wait and not self.ready:
            self._serve_one()
        out, self.ready = self.ready, []
        return out


def _judge(completion, example):
    return Outcome.passed() if completion == "yes" else Outcome.model_fail()


class TurnEpisodes:
    """An environment session whose episodes take 1 to 3 engine calls each (as `EnvSession.requests`):
    each turn is served by whatever version the engine holds then; a sample's version is the oldest."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def requests(self, examples, n, sampling):
        oldest = ro = None
        for _ in range(self.rng.randint(1, 3)):
            ro = yield [[1, 2, 3]] * len(examples), n, sampling
            oldest = ro.policy_version if oldest is None else list(map(min, oldest, ro.policy_version))
        ro = dataclasses.replace(ro, policy_version=oldest)
        return ro, [_judge(t, None) for t in ro.texts], list(range(len(ro))), [None] * len(ro)


@pytest.mark.parametrize("multi_turn", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_staleness_bound_holds_under_a_randomly_slow_engine(seed, multi_turn):
    """Single-turn requests, or episodes of several turns driven by the controller: every trained
    sample (every turn of it) is within K versions, and the pipeline never exceeds (K + 1) * P. While
    the trainer computes, the receiver thread polls the engine a random number of times, judging and
    admitting; the step being trained counts as P groups, so it leaves at most K * P in the pipeline."""
    rng = random.Random(seed)
    K, P, G = rng.randint(0, 3), rng.randint(1, 4), rng.randint(1, 3)
    dynamic = rng.random() < 0.5
    cfg = load_config(RLConfig, None, [f"max_staleness={K}", f"prompts_per_step={P}", f"rollout.group_size={G}",
                                       "mode=async", f"dynamic_sampling.enabled={dynamic}", f"seed={seed}"])
    examples = [{"prompt": f"p{i}", "answer": "yes"} for i in range(7)]
    run = types.SimpleNamespace(cfg=cfg, source=CurriculumSource(examples, seed, cfg.curriculum),
                                train_prompts={i: [1, 2, 3] for i in range(7)}, verifier=_judge,
                                env=TurnEpisodes(rng) if multi_turn else None)
    engine = SlowEngine(rng)
    ctl = AsyncController(run, engine)
    ctl.POLL_S = 1e-4
    worst, trained, admitted_while_training = 0, 0, 0
    for step in range(1, 31):
        groups = ctl.take(step)
        stale = [engine.version - v for g in groups for v in g.rollouts.policy_version]
        assert all(0 <= s <= K for s in stale), f"step {step}: staleness {max(stale)} > K={K}"
        assert len(groups) == P or dynamic
        m = ctl.step_metrics(groups)
        assert m["async/staleness_max"] <= K and m["async/bound_requeued"] == 0
        worst, trained = max([worst, *stale]), trained + len(groups)
        if groups:  # as the loop: a starved step neither trains nor pushes weights
            polls = engine.polls + rng.randint(0, 4)
            with ctl.while_training():
                while engine.polls < polls:
                    time.sleep(1e-4)
            assert ctl.pipeline() <= K * P
            admitted_while_training += ctl.overlap["async/admitted_while_training"]
            engine.load_weights(None, engine.version + 1, "")
        ctl.fill()
        assert ctl.pipeline() <= (K + 1) * P
    counts = ctl.ledger.counts()
    assert counts["trained"] == trained and sum(counts.values()) == len(ctl.ledger)
    steps = [s for s in ctl.ledger.step if s >= 0]
    assert len(steps) == trained and all(1 <= s <= 30 for s in steps)
    if K and not dynamic:
        assert worst == K, "a slow engine should push some samples right up to the bound"
    if K and dynamic and G > 1:
        assert admitted_while_training > 0, "dropped groups free room that the receiver thread fills"


class BrokenEngine(SlowEngine):
    def poll(self, wait):
        raise EngineTimeout("engine replica 0 did not answer request 3")


def test_an_engine_error_met_while_training_is_raised_by_the_next_take():
    # Not at the end of the block: the update inside it is complete and its step must be recorded first.
    cfg = load_config(RLConfig, None, ["mode=async", "max_staleness=1", "prompts_per_step=2", "rollout.group_size=2"])
    run = types.SimpleNamespace(cfg=cfg, source=CurriculumSource([{"prompt": "p", "answer": "yes"}] * 4, 0, cfg.curriculum),
                                train_prompts={i: [1, 2] for i in range(4)}, verifier=_judge, env=None)
    ctl = AsyncController(run, BrokenEngine(random.Random(0)))
    with ctl.while_training():
        time.sleep(0.05)
    assert ctl.taken == 0 and isinstance(ctl.failure, EngineTimeout)
    with pytest.raises(EngineTimeout, match="request 3"):
        ctl.take(1)


# ------------------------------------------------------------------------------------- correction


def test_async_with_importance_weights_refuses_correction_off_unless_forced(rl_overrides, capsys, tmp_path):
    decoupled = {"asynchrony.decoupled_ppo": True}
    code = main(["rl", *rl_overrides(mode="async", **decoupled, **{"correction.kind": "none"})])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "correction.kind: none is refused in async mode" in err and "force_no_correction=true" in err
    assert not (tmp_path / "run").exists()
    cfg = load_config(RLConfig, None, rl_overrides(mode="async", force_no_correction=True, **decoupled,
                                                   **{"correction.kind": "none"}))
    assert cfg.correction.kind == "none"
    for extra in (decoupled, {"policy_loss": "pg"}):  # the weights enter the loss: on by default
        assert load_config(RLConfig, None, rl_overrides(mode="async", **extra)).correction.kind == "truncated"
    assert load_config(RLConfig, None, rl_overrides()).correction.kind == "truncated"  # sync too


@pytest.mark.parametrize("override", ["correction.kind=truncated", "correction.kind=mis", "correction.cap=1.5",
                                      "correction.level=sequence", "force_no_correction=true"])
def test_correction_knobs_that_do_nothing_in_async_anchored_mode_are_refused(rl_overrides, override):
    """Async's default takes the PPO ratio against the sampler: its clip bounds stale samples and no
    importance weight enters the loss, so a correction setting there would be silently ignored."""
    from posttrain.errors import UserError

    with pytest.raises(UserError, match=override.split("=")[0] + ".*has no effect"):
        load_config(RLConfig, None, rl_overrides(mode="async") + [override])


def test_async_anchored_mode_says_no_correction_and_accepts_kind_none(rl_overrides, capsys, tmp_path):
    """There the clip bounds stale samples: kind none is what the mode does, not a risk to refuse,
    and is what config.yaml records; a knob it ignores exits 2 with one line naming it."""
    cfg = load_config(RLConfig, None, rl_overrides(mode="async"))
    assert cfg.correction.kind == "none" and not cfg.importance_weighted
    assert load_config(RLConfig, None, rl_overrides(mode="async", **{"correction.kind": "none"})).correction.kind == "none"
    assert main(["rl", *rl_overrides(mode="async", **{"correction.cap": 1.5})]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "correction.cap" in err and "has no effect" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("decoupled", [True, False])
def test_decoupled_ppo_clips_around_the_trainer_and_behaviour_mode_around_the_sampler(rl_overrides, reward_plugin,
                                                                                     decoupled):
    import math

    from posttrain.rl.loop import collect, learn
    from posttrain.tracking import StageTimer

    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters",
                                                   **{"asynchrony.decoupled_ppo": decoupled}))
    run = setup(cfg)
    ro, outcomes, info, _ = collect(run, 1)
    ro.logprobs = [[lp + 0.5 for lp in row] for row in ro.logprobs]  # as if sampled by an older policy
    run.cfg.mode = "async"
    m = learn(run, 1, StageTimer(), ro, outcomes, info)
    stale_ratio = math.exp(-0.5)
    if decoupled:  # PPO ratio against the trainer's own log-probs; the staleness shows in the IS weight
        assert m["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert m["is/ratio_mean"] == pytest.approx(stale_ratio, rel=1e-3)
    else:  # PPO ratio against the sampler's log-probs, no separate weight
        assert m["policy/ratio_mean"] == pytest.approx(stale_ratio, rel=1e-3)


# ------------------------------------------------------------------------------------- weight sync


def _local_run(rl_overrides, reward_plugin, **extra):
    from posttrain.rollout import TorchEngine

    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **extra))
    run = setup(cfg)
    dtype = cfg.rollout.engine_dtype
    return run, LocalEngine(TorchEngine(cfg.model.path, tokenizer=run.tokenizer, dtype=getattr(torch, dtype)), dtype)


def test_self_test_passes_on_a_sound_engine(rl_overrides, reward_plugin):
    run, engine = _local_run(rl_overrides, reward_plugin)
    m = self_test(run, engine)
    assert m["selftest/mismatch_kl"] < 1e-6 and m["selftest/is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_self_test_catches_a_sync_that_never_reaches_the_sampler(rl_overrides, reward_plugin):
    run, engine = _local_run(rl_overrides, reward_plugin)
    import copy

    from posttrain.rollout.fast_llama import FastLlamaDecoder

    # The engine's state dict takes the new weights (so the checksum read-back passes), but it keeps
    # sampling from a stale copy, as a decoder that caches its weights and misses a refresh would.
    engine.engine.decoder = FastLlamaDecoder(copy.deepcopy(engine.engine.model))
    with pytest.raises(SelfTestError, match="did not reach the engine's sampler"):
        self_test(run, engine)


def test_self_test_catches_sampler_trainer_disagreement(rl_overrides, reward_plugin):
    run, engine = _local_run(rl_overrides, reward_plugin, **{"rollout.engine_dtype": "bfloat16",
                                                            "asynchrony.self_test_max_kl": 1e-9})
    with pytest.raises(SelfTestError, match="sampler and trainer disagree"):
        self_test(run, engine)


def test_weights_that_do_not_land_intact_are_detected(rl_overrides, reward_plugin):
    run, engine = _local_run(rl_overrides, reward_plugin)
    weights = run.policy.export_weights()
    original = engine.engine.load_weights

    def lossy(w, version, checksum):  # accepts, then loses one tensor's update
        original(w, version, checksum)
        next(iter(engine.engine.model.parameters())).data.add_(1.0)

    engine.engine.load_weights = lossy
    with pytest.raises(WeightSyncError, match="did not reach the engine intact"):
        engine.load_weights(weights, 1, weights_checksum(weights))


def test_corrupted_weight_sync_to_the_engine_process_is_refused(nano_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    weights = AutoModelForCausalLM.from_pretrained(nano_model_dir).state_dict()
    pack = worker._pack_weights

    def corrupting(w):  # one value flipped after the checksum was taken, as a bad transfer would
        w = {k: v.clone() for k, v in w.items()}
        next(iter(w.values())).view(-1)[0] += 1.0
        return pack(w)

    monkeypatch.setattr(worker, "_pack_weights", corrupting)
    engine = ProcessEngine(str(nano_model_dir), threads=1, timeout_s=60, printer=lambda *_: None)
    try:
        engine.load_weights(weights, 1, weights_checksum(weights))
        with pytest.raises(WeightSyncError, match="refused weights of version 1.*checksum mismatch"):
            engine.wait_synced()
    finally:
        engine.close()


@pytest.mark.slow
def test_engine_process_restarts_after_death_and_hangs_time_out(nano_model_dir):
    notes = []
    engine = ProcessEngine(str(nano_model_dir), threads=1, timeout_s=60, max_restarts=1, printer=notes.append)
    sp = SamplingParams(max_new_tokens=4, seed=3)
    try:
        before = engine.generate([[1, 2, 3]], 2, sp)
        os.kill(engine.proc.pid, signal.SIGKILL)
        rid = engine.submit([[1, 2, 3]], 2, sp)
        (reply,) = engine.poll(wait=True)
        assert reply.rid == rid and reply.rollouts.completion_ids == before.completion_ids
        assert engine.restarts == 1 and "engine_restart" in notes[0]
        engine.timeout_s = 2.0
        os.kill(engine.proc.pid, signal.SIGSTOP)  # alive but stuck
        with pytest.raises(EngineTimeout, match=r"did not answer generate request \d+ within 2 s"):
            engine.generate([[1, 2, 3]], 2, sp)
        os.kill(engine.proc.pid, signal.SIGKILL)
        engine.submit([[1, 2, 3]], 1, sp)
        with pytest.raises(EngineDied, match="died 2 times"):
            engine.poll(wait=True)
    finally:
        engine.close()


def _kill_then_resume(rl_overrides, reward_plugin, tmp_path, monkeypatch, name, killing, check_stop):
    """4 async steps with ``AsyncController.<name>`` replaced by ``killing(original)``, which kills the
    engine (no restart allowed); ``check_stop(notes)`` then looks at the stopped run. A re-run resumes
    with the original, and every prompt is trained exactly once, one metrics row per step."""
    from posttrain.rl.ledger import PromptLedger
    from posttrain.core.checkpoint import load_trainer_state

    args = dict(verifier=f"{reward_plugin}:letters", mode="async", max_staleness=1, num_steps=4, save_every=1)
    original = getattr(AsyncController, name)
    monkeypatch.setattr(AsyncController, name, killing(original))
    notes = []
    with pytest.raises(EngineDied):
        run_rl(load_config(RLConfig, None, rl_overrides(**args, **{"asynchrony.max_engine_restarts": 0})),
               printer=notes.append)
    check_stop(notes)
    monkeypatch.setattr(AsyncController, name, original)
    run_rl(load_config(RLConfig, None, rl_overrides(**args)), printer=lambda *_: None)
    led = PromptLedger()
    led.load_state_dict(load_trainer_state(tmp_path / "run" / "checkpoints" / "step-4")["async"]["ledger"])
    assert {s: len(u) for s, u in led.trained_by_step().items()} == {1: 4, 2: 4, 3: 4, 4: 4}
    assert sorted(u for us in led.trained_by_step().values() for u in us) == list(range(16))
    assert [r["step"] for r in _rows(tmp_path / "run")] == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_engine_dying_for_good_stops_with_a_checkpoint_and_resume_finishes(rl_overrides, reward_plugin, tmp_path,
                                                                           monkeypatch):
    from posttrain.core.checkpoint import load_trainer_state

    def killing_at_step_3(take):
        def take_killing_the_engine_at_step_3(self, step):
            if step == 3:
                os.kill(self.engine.proc.pid, signal.SIGKILL)
            return take(self, step)
        return take_killing_the_engine_at_step_3

    def check_stop(notes):
        stopped_at = int(notes[-1].split("checkpoint at step ")[1].split()[0])
        assert 2 <= stopped_at < 4  # the engine's death surfaces at step 3 or, if step 3 was buffered, step 4
        assert load_trainer_state(tmp_path / "run" / "checkpoints" / f"step-{stopped_at}")["step"] == stopped_at

    _kill_then_resume(rl_overrides, reward_plugin, tmp_path, monkeypatch, "take", killing_at_step_3, check_stop)


@pytest.mark.slow
def test_engine_dying_during_an_update_keeps_that_step(rl_overrides, reward_plugin, tmp_path, monkeypatch):
    """The engine dies while step 3 trains and the receiver thread sees it before the update ends:
    step 3 is logged and checkpointed as step 3 (not as step 2, to be trained again on resume)."""

    def killing_during_step_3(while_training):
        @contextlib.contextmanager
        def dying_during_step_3(self):
            with while_training(self):
                yield
                if self.ledger.trained_by_step().get(3):
                    os.kill(self.engine.proc.pid, signal.SIGKILL)
                    deadline = time.monotonic() + 60
                    while self.failure is None and time.monotonic() < deadline:
                        time.sleep(0.01)
                    assert isinstance(self.failure, EngineDied)
        return dying_during_step_3

    def check_stop(notes):
        assert notes[-1].startswith("the rollout engine failed; saved a checkpoint at step 3 ")
        assert [r["step"] for r in _rows(tmp_path / "run")] == [0, 1, 2, 3]

    _kill_then_resume(rl_overrides, reward_plugin, tmp_path, monkeypatch, "while_training", killing_during_step_3,
                      check_stop)


def test_a_refused_weight_acknowledgement_stops_with_a_checkpoint(rl_overrides, reward_plugin, tmp_path, monkeypatch):
    """From the third sync on, the weights the engine receives are not the ones sent: the run stops
    with WeightSyncError, and the last finished step is checkpointed under its own number (no
    periodic saves: it is the only checkpoint), as after an engine death. A re-run resumes from it
    and trains every prompt exactly once."""
    from posttrain.core.checkpoint import load_trainer_state
    from posttrain.rl.ledger import PromptLedger

    pack, calls = worker._pack_weights, []

    def corrupting_from_the_third(w):
        calls.append(1)
        if len(calls) < 3:
            return pack(w)
        w = {k: v.clone() for k, v in w.items()}
        next(iter(w.values())).view(-1)[0] += 1.0
        return pack(w)

    monkeypatch.setattr(worker, "_pack_weights", corrupting_from_the_third)
    notes, run_dir = [], tmp_path / "run"
    args = rl_overrides(verifier=f"{reward_plugin}:letters", mode="async", max_staleness=1, num_steps=6, save_every=0,
                        **{"asynchrony.self_test": False})
    with pytest.raises(WeightSyncError):
        run_rl(load_config(RLConfig, None, args), printer=notes.append)
    assert notes and notes[-1].startswith("the rollout engine failed; saved a checkpoint at step ")
    step = int(notes[-1].split("checkpoint at step ")[1].split()[0])
    assert 3 <= step < 6  # the third sync follows step 3; its refusal surfaces while a later step runs
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-")] == [f"step-{step}"]
    assert load_trainer_state(run_dir / "checkpoints" / f"step-{step}")["step"] == step
    assert [r["step"] for r in _rows(run_dir)] == list(range(1, step + 1))  # no self-test, no eval: no step 0
    monkeypatch.setattr(worker, "_pack_weights", pack)
    run_rl(load_config(RLConfig, None, args), printer=lambda *_: None)
    led = PromptLedger()
    led.load_state_dict(load_trainer_state(run_dir / "checkpoints" / "step-6")["async"]["ledger"])
    assert {s: len(u) for s, u in led.trained_by_step().items()} == {s: 4 for s in range(1, 7)}
    assert sorted(u for us in led.trained_by_step().values() for u in us) == list(range(24))
    assert [r["step"] for r in _rows(run_dir)] == list(range(1, 7))


def test_an_async_run_in_a_sync_runs_folder_is_one_line_exit_2(rl_overrides, capsys):
    """Its checkpoint has no async state: a KeyError traceback before, the run's folder named now."""
    assert main(["rl", *rl_overrides(num_steps=1, save_every=1)]) == 0
    capsys.readouterr()
    assert main(["rl", *rl_overrides(num_steps=2, save_every=1, mode="async")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "checkpoints/step-1: written by a sync run; an async run resumes only its own checkpoints "
        "(use a new out_dir, or mode=sync)")
