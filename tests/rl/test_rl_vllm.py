"""GRPO with rollouts from a real vLLM server (``-m vllm``): every sync verified by the version read
back and the probe, the sampler's log-probs equal to the trainer's, full weights and LoRA."""

from __future__ import annotations

import json

import httpx
import pytest

from posttrain.config import load_config
from posttrain.rl.config import RLConfig
from posttrain.rl.loop import drive_rl, probe_ids, rl_step, setup
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
def test_grpo_against_vllm(request, vllm_model_dir, arith_data_dir, reward_plugin, tmp_path, lora):
    url = request.getfixturevalue("vllm_lora_server" if lora else "base_restored").urls[0]
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


def test_two_launched_servers_one_killed_mid_run_relaunches_with_the_current_adapter(
        vllm_model_dir, arith_data_dir, reward_plugin, tmp_path, monkeypatch):
    """``rollout.vllm.launch=2`` with a LoRA policy, async K=1. Server 1 gets SIGKILL at step 3:
    its requests go to server 0, it leaves the rotation, is relaunched in the background, handed
    the newest adapter (verified by the probe) and put back; the run finishes with every prompt
    trained once, within the staleness bound, and stops both servers at the end."""
    import time

    from posttrain.rl.async_.controller import AsyncController
    from posttrain.rl.run import run_rl
    from posttrain.rollout.vllm_servers import VLLMServers

    launched, notes = [], []
    start, take = VLLMServers.start, AsyncController.take

    def record(self):
        launched.append(self)
        return start(self)

    def take_killing_then_waiting(self, step):
        if step == 3:
            self.engine.servers.kill(1)
        if step == 6:  # let the relaunch finish (a CPU server takes 30-100 s to start)
            deadline = time.monotonic() + 300
            while self.engine.live < 2 and time.monotonic() < deadline:
                time.sleep(1)
        return take(self, step)

    monkeypatch.setattr(VLLMServers, "start", record)
    monkeypatch.setattr(AsyncController, "take", take_killing_then_waiting)
    steps = 8
    cfg = load_config(RLConfig, None, _overrides(vllm_model_dir, arith_data_dir, tmp_path / "run", reward_plugin,
                                                 **{"rollout.vllm.launch": 2, "rollout.vllm.max_model_len": 256,
                                                    "model.lora.enabled": "true", "model.lora.r": 8,
                                                    "optim.lr": 1e-2, "mode": "async", "max_staleness": 1,
                                                    "num_steps": steps, "save_every": steps}))
    run_rl(cfg, printer=notes.append)
    rows = [m for m in _metrics(tmp_path / "run") if m["step"] > 0]
    assert [m["step"] for m in rows] == list(range(1, steps + 1))
    assert all(m["async/staleness_max"] <= 1 for m in rows)  # (stale samples differ from the trainer: no mismatch bound)
    trained = _ledger_trained(tmp_path / "run", steps)
    assert len(trained) == len(set(trained)) == steps * cfg.prompts_per_step  # none lost, none twice
    assert rows[-1]["async/engine_restarts"] == 1
    assert any("[server_lost]" in n and "1 of 2 left" in n for n in notes), notes
    assert any("[server_back]" in n for n in notes), notes  # relaunched and confirmed the newest adapter
    [servers] = launched
    assert (tmp_path / "run" / "vllm_logs" / "vllm-1.log").stat().st_size > 0
    assert all(p.poll() is not None for p in servers.procs)  # stopped with the run
    for url in servers.urls:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)


def _ledger_trained(run_dir, step: int) -> list[int]:
    from posttrain.core.checkpoint import load_trainer_state
    from posttrain.rl.ledger import PromptLedger

    led = PromptLedger()
    led.load_state_dict(load_trainer_state(run_dir / "checkpoints" / f"step-{step}")["async"]["ledger"])
    return [u for us in led.trained_by_step().values() for u in us]


def test_async_k1_against_vllm_keeps_the_bound_and_trains_every_prompt_once(base_restored, vllm_model_dir,
                                                                           arith_data_dir, reward_plugin, tmp_path):
    """mode=async, K=1 against vLLM: every sample within one version of the weights that train on
    it, every prompt trained once, every version confirmed. (That a push meets generations in flight
    and they finish under the new weights: tests/rollout/test_vllm.py.)"""
    from posttrain.rl.run import run_rl

    vllm_server, steps = base_restored, 6
    cfg = load_config(RLConfig, None, _overrides(vllm_model_dir, arith_data_dir, tmp_path / "run", reward_plugin,
                                                 **{"rollout.urls": json.dumps(vllm_server.urls), "mode": "async",
                                                    "max_staleness": 1, "num_steps": steps, "save_every": steps,
                                                    "rollout.max_new_tokens": 48}))
    run_rl(cfg, printer=lambda *_: None)
    rows = [m for m in _metrics(tmp_path / "run") if m["step"] > 0]
    assert [m["step"] for m in rows] == list(range(1, steps + 1))
    assert all(m["async/staleness_max"] <= 1 for m in rows) and any(m["async/staleness_max"] == 1 for m in rows)
    assert all(m["outcomes/INFRA_FAIL_frac"] == 0 for m in rows)
    trained = _ledger_trained(tmp_path / "run", steps)
    assert len(trained) == len(set(trained)) == steps * cfg.prompts_per_step
    assert httpx.get(f"{vllm_server.urls[0]}/weight_info").json()["weight_version"] == str(steps)


def test_async_lora_with_seeded_steps_past_one_prefill_budget_keeps_the_engine_alive(vllm_lora_server, vllm_model_dir,
                                                                                       arith_data_dir, reward_plugin,
                                                                                       tmp_path):
    """Async + LoRA, the layout that lost its engine 1 run in 3: RL seeds every request, and 32
    prompts x 8 samples put more prompt tokens in flight than one engine step prefills, while each
    sync preempts and recomputes the requests. On a CPU build a seeded request whose prefill is split
    killed the engine (`CPU Generator does not use offset`); the client now sends CPU builds no seeds."""
    from posttrain.rl.run import run_rl

    steps = 3
    cfg = load_config(RLConfig, None, _overrides(vllm_model_dir, arith_data_dir, tmp_path / "run", reward_plugin,
                                                 **{"rollout.urls": json.dumps(vllm_lora_server.urls), "mode": "async",
                                                    "max_staleness": 1, "num_steps": steps, "prompts_per_step": 32,
                                                    "rollout.group_size": 8, "rollout.max_new_tokens": 16,
                                                    "model.lora.enabled": "true", "model.lora.r": 8,
                                                    "optim.lr": 1e-2}))
    run_rl(cfg, printer=lambda *_: None)
    rows = [m for m in _metrics(tmp_path / "run") if m["step"] > 0]
    assert [m["step"] for m in rows] == list(range(1, steps + 1))
    assert all(m["outcomes/INFRA_FAIL_frac"] == 0 and m["async/lost_requests"] == 0 for m in rows), rows
    assert rows[-1]["async/engine_restarts"] == 0
    assert httpx.get(f"{vllm_lora_server.urls[0]}/health").status_code == 200


def test_a_trainer_killed_with_sigkill_resumes_against_the_same_server(base_restored, vllm_model_dir, arith_data_dir,
                                                                       reward_plugin, tmp_path):
    """``kill -9`` of ``posttrain rl`` after its step-2 checkpoint; the re-run resumes there, hands
    the server the checkpoint's weights again (verified by the probe) and finishes: one metrics row
    per step, each sampled by the weights it was meant to be."""
    vllm_server = base_restored
    import os
    import signal
    import subprocess
    import sys
    import time

    steps, out = 5, tmp_path / "run"
    args = _overrides(vllm_model_dir, arith_data_dir, out, reward_plugin,
                      **{"rollout.urls": json.dumps(vllm_server.urls), "num_steps": steps, "save_every": 1})
    env = {**os.environ, "PYTHONPATH": f"{reward_plugin_dir(reward_plugin)}:{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "posttrain", "rl", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / "step-2").is_dir():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no step-2 checkpoint within 300 s"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run([sys.executable, "-m", "posttrain", "rl", *args], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    rows = _metrics(out)
    assert [m["step"] for m in rows] == list(range(1, steps + 1))
    assert all(m["mismatch/logprob_abs_diff_max"] < 1e-4 for m in rows)  # the server held each version's weights
    assert httpx.get(f"{vllm_server.urls[0]}/weight_info").json()["weight_version"] == str(steps)


def reward_plugin_dir(module: str) -> str:
    import importlib
    from pathlib import Path

    return str(Path(importlib.import_module(module).__file__).parent)
