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

    def load_weights(self, weights, version, checksum) -> None:
        self.engine.load_weights(weights, version, checksum)


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
