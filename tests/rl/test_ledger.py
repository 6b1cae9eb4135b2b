"""The prompt ledger: legal moves only, round trip, and kill -9 at random points of an async run
followed by resume leaves every drawn prompt trained exactly once, in the order an uninterrupted
run would train them."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from posttrain.rl.ledger import LedgerError, PromptLedger
from posttrain.rl.prompts import PromptSource
from posttrain.core.checkpoint import load_trainer_state


def test_entries_move_pending_in_flight_completed_trained():
    led = PromptLedger()
    uids = led.add([7, 3, 7])
    assert uids == [0, 1, 2] and led.pending() == [0, 1, 2]
    led.dispatch(uids)
    led.complete(0, version=4)
    led.train(0, step=5)
    led.complete(1, version=4)
    led.drop(1, "zero_variance")
    assert led.requeue_in_flight("resume") == 1 and led.pending() == [2]
    assert led.counts() == {"pending": 1, "in_flight": 0, "completed": 0, "trained": 1, "dropped": 1}
    assert led.summary()["entries"][1]["reason"] == "zero_variance"
    assert led.summary()["entries"][2]["requeued"] == 1
    assert led.trained_by_step() == {5: [0]}


@pytest.mark.parametrize("move", ["train", "complete", "drop"])
def test_illegal_moves_raise(move):
    led = PromptLedger()
    led.add([1])
    with pytest.raises(LedgerError, match="uid 0 .* is pending"):
        {"train": lambda: led.train(0, 1), "complete": lambda: led.complete(0, 0),
         "drop": lambda: led.drop(0, "x")}[move]()


def test_state_round_trip():
    led = PromptLedger()
    led.add([1, 2])
    led.dispatch([0])
    led.complete(0, 1)
    copy = PromptLedger()
    copy.load_state_dict(led.state_dict())
    assert copy.summary() == led.summary()


def _cli(*args):
    return [sys.executable, "-m", "posttrain.cli", "rl", *map(str, args)]


@pytest.mark.slow
def test_kill_9_at_random_points_then_resume_trains_every_prompt_exactly_once(rl_overrides, reward_plugin, tmp_path):
    steps, P, K = 10, 4, 2  # two kills, each 2+ steps after the last checkpoint, leave steps to resume
    args = rl_overrides(verifier=f"{reward_plugin}:letters", mode="async", max_staleness=K, num_steps=steps,
                        save_every=1, keep_last=2, **{"asynchrony.self_test": False})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    rng = random.Random(0)
    kills = 0
    while kills < 2:  # kill -9 at random moments, each after a fresh checkpoint, until it happened twice
        proc = subprocess.Popen(_cli(*args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        target, deadline = latest_step(run_dir) + 2, time.time() + 180
        while latest_step(run_dir) < target and proc.poll() is None:
            assert time.time() < deadline, "no progress"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is not None:
            break  # the run got to the end first
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills >= 1, "the run was never killed mid-way"
    done = subprocess.run(_cli(*args), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed from" in done.stdout
    state = load_trainer_state(run_dir / "checkpoints" / f"step-{steps}")
    led = PromptLedger()
    led.load_state_dict(state["async"]["ledger"])
    by_step = led.trained_by_step()
    assert sorted(by_step) == list(range(1, steps + 1)) and all(len(u) == P for u in by_step.values())
    trained = sorted(u for us in by_step.values() for u in us)
    assert trained == list(range(steps * P)), "every drawn prompt trained once, none skipped"
    examples = [json.loads(line) for line in open(args_value(args, "data.path"))]
    expected = [i for i, _ in PromptSource(examples, 0).next(steps * P)]
    assert [led.index[u] for u in trained] == expected, "the same prompts an uninterrupted run trains"
    assert [r["step"] for r in rows(run_dir)] == list(range(1, steps + 1))
    assert json.loads((run_dir / "ledger.json").read_text())["counts"]["trained"] == steps * P


def latest_step(run_dir) -> int:
    done = [int(p.parent.name.split("-")[1]) for p in run_dir.glob("checkpoints/step-*/trainer_state.pt")
            if not p.parent.name.endswith(".tmp")]
    return max(done, default=0)


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def args_value(args, key):
    return next(a.split("=", 1)[1] for a in args if a.startswith(key + "="))
