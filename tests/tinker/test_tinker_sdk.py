"""The official `tinker` SDK (from PyPI, in .venv-tinker) against `posttrain tinker-serve`: a LoRA
client on the embedded tiny model, a supervised loop whose loss falls, an RL loop whose sampler and
trainer log-probs agree, a bit-identical save/load round trip, two clients on one base, and the
errors the SDK raises. Lane: ``pytest -m tinker`` (bash scripts/setup.sh tinker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-tinker" / "bin" / "python"
KEY = "tml-lane-key"

pytestmark = [pytest.mark.tinker,
              pytest.mark.skipif(not SDK_PYTHON.exists(), reason="needs .venv-tinker (bash scripts/setup.sh tinker)")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker-root")
    env = dict(os.environ, OMP_NUM_THREADS="1", POSTTRAIN_API_KEY=KEY)
    proc = subprocess.Popen([sys.executable, "-m", "posttrain", "tinker-serve", "--root", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    url = None
    for line in proc.stdout:
        if line.startswith("posttrain tinker-serve:") and " at " in line:
            url = line.split(" at ")[1].split()[0]
            break
    assert url, "the server did not start"
    yield url, root
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def report(server):
    url, _ = server
    env = dict(os.environ, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # the SDK's environment sees no posttrain
    out = subprocess.run([str(SDK_PYTHON), str(Path(__file__).with_name("sdk_client.py")), url],
                         capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("REPORT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(lines[-1][len("REPORT "):])


def test_supervised_loss_falls(report):
    losses = report["sl_losses"]
    assert report["capabilities"] == ["posttrain/tiny"]
    assert losses[-1] < 0.5 * losses[0], losses
    assert sum(b < a for a, b in zip(losses, losses[1:])) >= len(losses) - 2, losses


def test_rl_sampler_and_trainer_agree(report):
    rl = report["rl"]
    assert rl["n_samples"] == 4 and all(0 < n <= 8 for n in rl["lengths"])
    assert rl["gap"] < 1e-4, rl  # sampler (engine, merged adapter) vs trainer (peft forward)
    assert rl["prompt_logprobs_first"] is None and rl["prompt_gap"] < 1e-4
    # on-policy right after the snapshot: importance ratios are 1 and nothing is clipped
    assert abs(rl["metrics"]["importance_sampling"]["ratio_mean:mean"] - 1) < 1e-4
    assert rl["metrics"]["importance_sampling"]["clip_frac:mean"] == 0
    assert rl["metrics"]["ppo"]["ratio_max:max"] > 1.0  # the IS step moved the policy before PPO's
    assert rl["moved"] > 1e-3
    # topk_prompt_logprobs=3 as the SDK reads it: None at position 0, then three (id, logprob)
    # pairs, most likely first, none less likely than the prompt's own token
    topk, prompt_lp = rl["topk"], rl["prompt_logprobs"]
    assert topk[0] is None and len(topk) == len(prompt_lp) and all(len(row) == 3 for row in topk[1:])
    assert all(row[0][1] >= row[1][1] >= row[2][1] and lp <= row[0][1] + 1e-6 for row, lp in zip(topk[1:], prompt_lp[1:]))


def test_state_round_trip_is_bit_identical(report):
    st = report["state"]
    assert st["path"].startswith("tinker://") and st["path"].endswith("/weights/round-trip")
    assert st["at_load_equal"] and st["after_step_equal"] and st["changed_by_step"]
    assert "weights/round-trip" in report["checkpoints"]


def test_two_clients_are_independent(report):
    two = report["two"]
    assert len(set(two["a_ids"])) == 2
    assert two["b_untouched_by_a"] and two["a_moved"] and two["a_equals_replay"]
    assert two["losses_a"][-1] < two["losses_a"][0]


def test_sdk_surfaces_errors(report):
    errors = report["errors"]
    assert errors["dro"].startswith("BadRequestError") and "'dro' is not supported" in errors["dro"]
    assert errors["bad_base"].startswith("BadRequestError") and "no/such-model" in errors["bad_base"]
    assert errors["bad_input"].startswith("BadRequestError") and "needs 'logprobs'" in errors["bad_input"]
