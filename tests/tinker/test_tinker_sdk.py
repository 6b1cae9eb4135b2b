"""The official `tinker` SDK (from PyPI, in .venv-tinker) against `posttrain tinker-serve`: a LoRA
client on the embedded tiny model, a supervised loop whose loss falls, an RL loop whose sampler and
trainer log-probs agree, greedy sampling, a bit-identical save/load round trip, two clients on one
base, the tokenizer loaded offline, the errors the SDK raises, and sessions that end (finished with
``with``, or evicted) giving their training clients up. Lane: ``pytest -m tinker`` (bash
scripts/setup.sh tinker)."""

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


def launch(root: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", POSTTRAIN_API_KEY=KEY)
    return subprocess.Popen([sys.executable, "-m", "posttrain", "tinker-serve", "--root", str(root), "--port", "0",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)


def url_of(proc: subprocess.Popen) -> str:
    for line in proc.stdout:
        if line.startswith("posttrain tinker-serve:") and " at " in line:
            return line.split(" at ")[1].split()[0]
    proc.wait(30)
    raise AssertionError("the server did not start")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The main server (the embedded tiny model), and a small one on the same root and model
    served under its folder's path as its name, with room for two training clients and two
    sessions; the small one starts while the main one's client runs."""
    root = tmp_path_factory.mktemp("tinker-root")
    procs = [launch(root)]
    try:
        url = url_of(procs[0])
        folder = str(root / "_base" / "tiny")  # built by the main server before it printed its URL
        procs.append(launch(root, "--model", f"{folder}={folder}", "--max-models", "2", "--max-sessions", "2"))
        yield {"url": url, "root": root, "small": procs[1], "folder": folder}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)


@pytest.fixture(scope="module")
def server(servers):
    return servers["url"], servers["root"]


@pytest.fixture(scope="module")
def small_server(servers):
    return url_of(servers["small"]), servers["folder"]


def run_client(*args: str) -> dict:
    # HF_HUB_OFFLINE: a tokenizer looked up on the hub fails at once instead of after a minute of retries
    env = dict(os.environ, TINKER_API_KEY=KEY, TINKER_TELEMETRY="0", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # the SDK's environment sees no posttrain
    out = subprocess.run([str(SDK_PYTHON), str(Path(__file__).with_name("sdk_client.py")), *args],
                         capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("REPORT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(lines[-1][len("REPORT "):])


@pytest.fixture(scope="module")
def report(server):
    return run_client(server[0])


@pytest.fixture(scope="module")
def lifecycle(small_server, report):
    url, folder = small_server
    return run_client(url, "lifecycle", folder, report["named_sampler"])


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


def test_temperature_zero_is_greedy(report):
    greedy = report["greedy"]
    assert "error" not in greedy, greedy
    assert len(greedy["tokens"]) == 3 and greedy["tokens"][0] and all(t == greedy["tokens"][0] for t in greedy["tokens"])
    assert greedy["gap"] < 1e-4, greedy  # the log-probs are the trainer's, at temperature 1


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


def test_training_client_tokenizer_loads_offline(report, server):
    tok = report["tokenizer"]
    assert tok["tokenizer_id"] == str(server[1] / "_base" / "tiny")
    assert tok.get("round_trip") == "2 + 3 = 5", tok  # from the folder: the hub is off (HF_HUB_OFFLINE)


def test_missing_sampler_checkpoint_fails_at_once(report):
    missing = report["missing_sampler"]
    assert missing["error"].startswith("NotFoundError") and "no checkpoint" in missing["error"], missing
    assert missing["seconds"] < 5, missing  # no retries (a 500 was retried 11 times over ~58 s)


def test_leaving_with_finishes_the_session(report):
    block = report["with_block"]
    assert "error" not in block, block
    assert block["exit_error"] is None and block["status_inside"] == [200], block
    assert block["status_after"] == 404, block  # the training client was unloaded with its session


def test_lifecycle_frees_slots_and_loads_tokenizers(lifecycle):
    assert lifecycle["first_session"] is None, lifecycle  # its `with` block left without an error
    assert lifecycle["tokenizers"] == ["2 + 3 = 5"] * 2  # training and sampling clients of a base named by its folder
    foreign = lifecycle["foreign"]  # a sampler checkpoint of posttrain/tiny, not served on this server
    assert foreign["error"].startswith("BadRequestError") and "not served here" in foreign["error"], foreign
    assert foreign["seconds"] < 5, foreign
    # the finished session's two clients were unloaded: two new sessions take both slots; a third
    # session evicts the first and its client's slot goes to the third session's client
    assert [lifecycle[f"client_{i}"] for i in range(3)] == [None] * 3, lifecycle
    assert lifecycle["evicted_status"] == 404
    assert lifecycle["close_errors"] == [None] * 3  # finishing an evicted session is no error either
