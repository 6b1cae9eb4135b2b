"""GRPO with rollouts from a real vLLM server (``-m vllm``): every sync verified by the version read
back and the probe, the sampler's log-probs equal to the trainer's, full weights and LoRA."""

from __future__ import annotations

import json

import httpx
import pytest

from posttrain.config import load_config
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import drive_rl, probe_ids, rl_step, run_sync, setup
from posttrain.rollout import HTTPEngine

pytestmark = pytest.mark.vllm

STEPS = 4


def _overrides(model_dir, data_dir, out, reward_plugin, **extra) -> list[str]:
    base = {"model.path": model_dir, "data.path": data_dir / "prompts_train.jsonl", "rollout.group_size": 4,
            "rollout.max_new_tokens": 8, "prompts_per_step": 4, "num_steps": STEPS, "eval_every": 0,
            "save_every": 0, "logging.progress": False, "out_dir": out, "optim.lr": 1e-3,
            "verifier": f"{reward_plugin}:letters", "rollout.backend": "vllm", "kl.track": False}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def base_restored(vllm_server, vllm_model_dir):
    """The session's server back on the model it started with after the test (a LoRA run's probe
    refuses, rightly, a server whose base weights are not the trainer's)."""
    yield vllm_server
    httpx.post(f"{vllm_server.urls[0]}/collective_rpc", timeout=120,
               json={"method": "reload_weights", "kwargs": {"weights_path": str(vllm_model_dir)}}).raise_for_status()


@pytest.mark.parametrize("lora", [False, True])
def test_grpo_against_vllm(base_restored, vllm_model_dir, arith_data_dir, reward_plugin, tmp_path, lora):
    url = base_restored.urls[0]
    extra = {"model.lora.enabled": "true", "model.lora.r": 8, "optim.lr": 1e-2} if lora else {}
    cfg = load_config(RLConfig, None, _overrides(vllm_model_dir, arith_data_dir, tmp_path / "run", reward_plugin,
                                                 **{"rollout.urls": json.dumps([url]), **extra}))
    run = setup(cfg)
    assert isinstance(run.engine, HTTPEngine) and run.engine.dialect.name == "vllm"
    start = run.policy.probe_logprobs(probe_ids(run.tokenizer))
    drive_rl(run, rl_step, config=cfg, name="rl", printer=lambda *_: None)

    got = _metrics(tmp_path / "run")
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    for m in got:
        # the sampler's log-probs are the trainer's (no truncation at T=1): a stale server would show
        assert m["mismatch/logprob_abs_diff_max"] < 1e-4, m
        assert m["outcomes/INFRA_FAIL_frac"] == 0.0
    assert [m["policy_version"] for m in got] == list(range(1, STEPS + 1))
    assert httpx.get(f"{url}/weight_info").json()["weight_version"] == str(STEPS)
    moved = max(abs(a - b) for a, b in zip(start, run.policy.probe_logprobs(probe_ids(run.tokenizer))))
    assert moved > 1e-3  # the policy trained, and each sync's probe saw the new weights
    files = sorted(p.name for p in (tmp_path / "run" / "rollout_weights" / f"v{STEPS}").iterdir())
    assert files == (["adapter_config.json", "adapter_model.safetensors"] if lora
                     else ["config.json", "generation_config.json", "model.safetensors"])


def test_launched_servers_run_and_stop_with_the_run(vllm_model_dir, arith_data_dir, reward_plugin, tmp_path,
                                                    monkeypatch):
    from posttrain.rollout.vllm_servers import VLLMServers

    launched = []
    start = VLLMServers.start

    def record(self):
        launched.append(self)
        return start(self)

    monkeypatch.setattr(VLLMServers, "start", record)
    cfg = load_config(RLConfig, None, _overrides(vllm_model_dir, arith_data_dir, tmp_path / "run", reward_plugin,
                                                 **{"rollout.vllm.launch": 1, "rollout.vllm.max_model_len": 256,
                                                    "num_steps": 2}))
    run_sync(cfg, printer=lambda *_: None)
    assert [m["step"] for m in _metrics(tmp_path / "run")] == [1, 2]
    [servers] = launched
    assert (tmp_path / "run" / "vllm_logs" / "vllm-0.log").stat().st_size > 0
    assert all(p.poll() is not None for p in servers.procs)  # stopped with the run
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{servers.urls[0]}/health", timeout=2)
