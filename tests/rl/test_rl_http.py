"""GRPO through OpenAI-compatible rollout servers (rollout.backend=openai) on the nano model."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest

from posttrain.config import load_config
from posttrain.rl.batch import outcome_batch
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import drive_rl, generate_groups, rl_step, setup
from posttrain.rollout import HTTPEngine, Rollouts
from posttrain.rollout.types import prompt_seed
from posttrain.tracking import StageTimer
from tests.rollout.test_http_engine import FakeServer, real_server

STEPS = 5


@pytest.fixture
def servers(nano_model_dir):
    """Two ``posttrain serve`` apps on the nano model, in process."""
    pair = [real_server(nano_model_dir) for _ in range(2)]
    yield pair
    for s in pair:
        s.stop()


@pytest.fixture
def fakes(nano_model_dir):
    """Two minimal servers that can be told to fail requests (tests/rollout/test_http_engine.py)."""
    pair = [FakeServer(nano_model_dir, "a"), FakeServer(nano_model_dir, "b")]
    yield pair
    for s in pair:
        s.stop()


class PerPromptSeeds:
    """The in-process engine sampling each prompt alone with `prompt_seed`, as each server does."""

    def __init__(self, engine):
        self.engine = engine

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, prompts, n, sampling) -> Rollouts:
        parts = [self.engine.generate([p], n, dataclasses.replace(sampling, seed=prompt_seed(sampling.seed, i)))
                 for i, p in enumerate(prompts)]
        return Rollouts.concat([r.select(list(range(n)), [i] * n) for i, r in enumerate(parts)])

    def load_version(self, buckets, version, digest, probe=None, dtype=None) -> None:
        self.engine.load_version(buckets, version, digest, probe)


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _http(servers, **extra) -> dict:
    return {"rollout.backend": "openai", "rollout.urls": json.dumps([s.url for s in servers]),
            "rollout.retry_backoff_s": 0.01, **extra}


def test_grpo_through_two_servers_reproduces_the_in_process_run(rl_overrides, reward_plugin, servers, tmp_path):
    """Same seeds, same metrics for 5 steps (reward/mean, loss, grad_norm within 1e-5), with two
    real ``posttrain serve`` apps.

    A server samples each prompt alone (one request per prompt, n = G) with the seed
    `prompt_seed(step seed, prompt index)`, which the server's engine takes as its call's seed and
    derives that one prompt's stream from, while an in-process multi-prompt call seeds prompt i's
    stream with `prompt_seed(step seed, i)` directly. So the in-process baseline samples the way the
    servers do: `PerPromptSeeds` wraps the run's own
    `TorchEngine` and calls it once per prompt with the same per-prompt seed. Everything else, from
    the weights each step samples with to the update, is the unchanged in-process loop.
    """
    common = dict(verifier=f"{reward_plugin}:letters", num_steps=STEPS, **{"kl.track": False})
    local = setup(load_config(RLConfig, None, rl_overrides(**common, out_dir=tmp_path / "local")))
    local.engine = PerPromptSeeds(local.engine)
    drive_rl(local, rl_step, config=local.cfg, name="rl", printer=lambda *_: None)
    remote = setup(load_config(RLConfig, None, rl_overrides(**common, out_dir=tmp_path / "remote",
                                                            **_http(servers))))
    assert isinstance(remote.engine, HTTPEngine)
    drive_rl(remote, rl_step, config=remote.cfg, name="rl", printer=lambda *_: None)

    want, got = _metrics(tmp_path / "local"), _metrics(tmp_path / "remote")
    assert [m["step"] for m in got] == [m["step"] for m in want] == list(range(1, STEPS + 1))
    for a, b in zip(got, want):
        for key in ("reward/mean", "loss", "grad_norm", "response_length/mean", "mismatch/kl"):
            # within 1e-5, relative too: the loss of an on-policy GRPO step is ~1e-7
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-9), (a["step"], key)
        assert a["outcomes/INFRA_FAIL_frac"] == 0.0 and a["policy_version"] == b["policy_version"]
    assert any(m["grad_norm"] > 0 for m in got)  # the comparison covers real updates
    # every server confirmed every version, and the trainer's weights went through the folder
    assert all(s.app.state.serve.version == STEPS for s in servers)
    assert sorted(p.name for p in (tmp_path / "remote" / "rollout_weights").iterdir()) == [f"v{STEPS - 1}",
                                                                                          f"v{STEPS}"]
    served = [s.app.state.serve.worker.requests_served for s in servers]
    assert sum(served) == STEPS * remote.cfg.prompts_per_step and min(served) > 0  # one request per group


def test_requests_no_server_can_answer_are_infra_fail_masked_and_counted(rl_overrides, reward_plugin, fakes):
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **_http(fakes)))
    run = setup(cfg)
    G, k = cfg.rollout.group_size, cfg.prompts_per_step
    doomed = tuple(run.train_prompts[copy.deepcopy(run.source).next(k)[0][0]])  # the step's first prompt
    for s in fakes:
        s.fail = lambda prompt: tuple(prompt) == doomed

    ro, outcomes, _ = generate_groups(dataclasses.replace(run, source=copy.deepcopy(run.source)), 1, 0, k)
    assert ro.finish_reason[:G] == ["error"] * G and "error" not in ro.finish_reason[G:]
    assert [o.cls.value for o in outcomes[:G]] == ["INFRA_FAIL"] * G
    assert all(o.reason == "rollout_error" for o in outcomes[:G])
    batch = outcome_batch(ro, outcomes, run.tokenizer.pad_token_id, G)
    assert batch.train_mask_BT[:G].sum() == 0 and batch.train_mask_BT[G:].sum() > 0  # masked from the gradient

    m = rl_step(run, 1, StageTimer())
    assert m["outcomes/INFRA_FAIL_frac"] == pytest.approx(1 / k)  # counted, never scored 0
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    assert run.engine.version == 1


def test_async_masks_samples_no_server_could_answer_instead_of_scoring_them(rl_overrides, reward_plugin, fakes):
    """Through `posttrain rl` in async mode: samples a server aborted come back empty with finish
    reason "error"; they are INFRA_FAIL, masked and counted, never graded as the empty answers they
    look like (the letters reward scores an empty completion MODEL_FAIL)."""
    from posttrain.cli import main

    for s in fakes:
        s.abort = lambda prompt: sum(prompt) % 3 == 0
    args = rl_overrides(verifier=f"{reward_plugin}:letters", mode="async", max_staleness=1, num_steps=3,
                        **_http(fakes))
    assert main(["rl", *args]) == 0
    rows = [m for m in _metrics(_out_dir(args)) if m["step"] > 0]
    assert [m["step"] for m in rows] == [1, 2, 3]
    assert sum(m["outcomes/INFRA_FAIL_frac"] for m in rows) > 0  # the fault was injected and met
    assert all(m.get("outcomes/INFRA_FAIL/rollout_error_frac", 0.0) == m["outcomes/INFRA_FAIL_frac"] for m in rows)
    assert not any("MODEL_FAIL/empty" in key for m in rows for key in m)
    assert all(math.isfinite(m["loss"]) for m in rows)


def _out_dir(args: list[str]):
    from pathlib import Path

    return Path(next(a for a in args if a.startswith("out_dir=")).split("=", 1)[1])


def _comparable(row: dict) -> dict:
    """A step's metrics that sync and async K=0 share (async adds its own; sync truncates IS weights).
    The largest sampler/trainer difference is float32 rounding (one or two ulps of a log-prob,
    ~5e-7 or ~1e-6, depending on how each run's kernels were batched): rounded to 1e-5, so that
    the comparison is of real mismatch."""
    out = {k: v for k, v in row.items() if not k.startswith(("time/", "async/", "selftest/"))
           and k not in ("tokens_per_s", "is/truncated_frac", "step")}
    if "mismatch/logprob_abs_diff_max" in out:
        out["mismatch/logprob_abs_diff_max"] = round(out["mismatch/logprob_abs_diff_max"], 5)
    return out


def test_async_through_servers_at_k0_equals_the_sync_run_through_servers(rl_overrides, reward_plugin, nano_model_dir,
                                                                         tmp_path):
    """mode=async against two ``posttrain serve`` apps, K=0: the same run as sync, step for step;
    every server confirmed every version, and the sampler/trainer agree (the self-test ran)."""
    from posttrain.rl.run import run_rl

    common = dict(verifier=f"{reward_plugin}:letters", num_steps=3, **{"kl.track": False})
    rows = {}
    for mode in ("sync", "async"):
        pair = [real_server(nano_model_dir) for _ in range(2)]
        try:
            run_rl(load_config(RLConfig, None, rl_overrides(**common, **_http(pair), mode=mode, max_staleness=0,
                                                            out_dir=tmp_path / mode)), printer=lambda *_: None)
            assert [s.app.state.serve.version for s in pair] == [3, 3]
        finally:
            for s in pair:
                s.stop()
        rows[mode] = [m for m in _metrics(tmp_path / mode) if m["step"] > 0]
    assert [m["step"] for m in rows["async"]] == [m["step"] for m in rows["sync"]] == [1, 2, 3]
    assert any(m["grad_norm"] > 0 for m in rows["sync"])
    for s, a in zip(rows["sync"], rows["async"]):
        assert _comparable(a) == pytest.approx(_comparable(s), rel=1e-5, abs=1e-7), s["step"]
        assert a["async/staleness_max"] == 0
    assert _metrics(tmp_path / "async")[0]["selftest/passed"] == 1


def test_async_through_servers_keeps_the_staleness_bound_and_trains_every_prompt_once(rl_overrides, reward_plugin,
                                                                                      servers, tmp_path):
    from posttrain.core.checkpoint import load_trainer_state
    from posttrain.rl.ledger import PromptLedger
    from posttrain.rl.run import run_rl

    run_rl(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", mode="async", max_staleness=1,
                                                    num_steps=4, save_every=4, **_http(servers))),
           printer=lambda *_: None)
    rows = [m for m in _metrics(tmp_path / "run") if m["step"] > 0]
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    assert all(m["async/staleness_max"] <= 1 for m in rows)
    assert any(m["async/staleness_max"] == 1 for m in rows)  # groups really were generated ahead of the trainer
    assert all(m["outcomes/INFRA_FAIL_frac"] == 0 for m in rows)
    led = PromptLedger()
    led.load_state_dict(load_trainer_state(tmp_path / "run" / "checkpoints" / "step-4")["async"]["ledger"])
    trained = [u for us in led.trained_by_step().values() for u in us]
    assert len(trained) == len(set(trained)) == 16


def test_a_server_that_dies_leaves_the_rotation_and_the_run_goes_on(rl_overrides, reward_plugin, servers):
    run = setup(load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", num_steps=4,
                                                         **_http(servers))))
    notes = []

    def step(run, n, timer):
        if n == 3:
            servers[1].stop()
        return rl_step(run, n, timer)

    drive_rl(run, step, config=run.cfg, name="rl", printer=notes.append)
    rows = _metrics(run.run_dir)
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    assert all(m["outcomes/INFRA_FAIL_frac"] == 0 for m in rows)  # its requests were retried on the other
    assert run.engine.live == 1 and run.engine.version == 4
    assert servers[0].app.state.serve.version == 4


def test_when_every_server_is_gone_the_run_checkpoints_its_last_step_and_resumes_as_if_never_stopped(
        rl_overrides, reward_plugin, nano_model_dir, tmp_path):
    """Both servers stop before step 3: `ServersDown`, a checkpoint of step 2 with the prompt
    source as it was after step 2 (not after step 3's draw), and a re-run against new servers
    trains steps 3 and 4 exactly as an uninterrupted run does."""
    from posttrain.rollout.http import ServersDown

    common = dict(verifier=f"{reward_plugin}:letters", num_steps=4, save_every=0, **{"kl.track": False})

    def run_with(pair, out, step_fn=rl_step, notes=None):
        try:
            run = setup(load_config(RLConfig, None, rl_overrides(**common, **_http(pair), out_dir=out)))
            drive_rl(run, step_fn, config=run.cfg, name="rl", printer=(notes.append if notes is not None
                                                                        else lambda *_: None))
        finally:
            for s in pair:
                s.stop()

    run_with([real_server(nano_model_dir)], tmp_path / "whole")
    pair, notes = [real_server(nano_model_dir) for _ in range(2)], []

    def dying(run, n, timer):
        if n == 3:
            for s in pair:
                s.stop()
        return rl_step(run, n, timer)

    with pytest.raises(ServersDown, match="every rollout server stopped answering"):
        run_with(pair, tmp_path / "cut", dying, notes)
    assert notes[-1].endswith("saved a checkpoint at step 2 (re-run to resume)")
    assert (tmp_path / "cut" / "checkpoints" / "step-2").is_dir()
    run_with([real_server(nano_model_dir)], tmp_path / "cut")
    whole, cut = _metrics(tmp_path / "whole"), _metrics(tmp_path / "cut")
    assert [m["step"] for m in cut] == [1, 2, 3, 4]
    for a, b in zip(cut, whole):
        assert _comparable(a) == pytest.approx(_comparable(b), rel=1e-5, abs=1e-7), a["step"]


def test_grpo_through_servers_spoken_to_in_sglang_dialect(rl_overrides, reward_plugin, servers, tmp_path):
    """``rollout.backend=sglang`` against two ``posttrain serve`` apps, which answer SGLang's routes:
    each sync is read back by ``weight_version`` and verified by the probe, and the sampler's
    log-probs stay the trainer's at every step (a server left on old weights would show in both)."""
    steps = 3
    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", num_steps=steps,
                                                   out_dir=tmp_path / "run", **{"kl.track": False},
                                                   **_http(servers, **{"rollout.backend": "sglang"})))
    run = setup(cfg)
    assert isinstance(run.engine, HTTPEngine) and run.engine.dialect.name == "sglang"
    drive_rl(run, rl_step, config=cfg, name="rl", printer=lambda *_: None)
    rows = _metrics(tmp_path / "run")
    assert [m["policy_version"] for m in rows] == list(range(1, steps + 1))
    assert all(m["mismatch/logprob_abs_diff_max"] < 1e-4 and m["outcomes/INFRA_FAIL_frac"] == 0 for m in rows)
    assert any(m["grad_norm"] > 0 for m in rows)
    assert all(s.app.state.serve.version == steps for s in servers)


@pytest.mark.parametrize("backend", ["openai", "sglang"])
def test_a_server_backend_without_servers_is_refused_naming_the_key(backend):
    from posttrain.errors import UserError

    with pytest.raises(UserError, match=rf"rollout.urls: backend={backend} needs at least one server"):
        load_config(RLConfig, None, [f"rollout.backend={backend}"])
