"""The shipped environment examples run as their comments say: examples/grpo_openenv_guess.yaml
(OpenEnv server launched from examples/envs/guess_openenv.py; slow lane) and
examples/grpo_verifiers_guess.yaml (the verifiers package examples/envs/guess_digit, run in
.venv-verifiers; verifiers lane), each a short GRPO run on the nano model whose episodes are all
graded by the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_example(recipe: str, model_dir, tmp_path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "examples" / "envs"), OMP_NUM_THREADS="1")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "rl", f"examples/{recipe}", f"model.path={model_dir}",
                        "num_steps=2", "eval_every=2", "logging.progress=false", f"out_dir={out}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    # every episode reached the environment's verdict (none masked), over several turns, and the
    # held-out eval ran through the same environment
    assert last["step"] == 2 and last["outcomes/INFRA_FAIL_frac"] == 0.0 and last["outcomes/TASK_FAIL_frac"] == 0.0
    assert last["env/turns_mean"] >= 1.0 and "eval/heldout/greedy/pass@1" in last
    return last


@pytest.mark.slow
def test_the_openenv_example_runs(nano_model_dir, tmp_path):
    pytest.importorskip("openenv.core")
    run_example("grpo_openenv_guess.yaml", nano_model_dir, tmp_path)


@pytest.mark.verifiers
def test_the_verifiers_example_runs(nano_model_dir, tmp_path):
    from posttrain.envs.vf_env import default_python

    if not Path(default_python()).exists():
        pytest.skip("needs .venv-verifiers (bash scripts/setup.sh verifiers)")
    run_example("grpo_verifiers_guess.yaml", nano_model_dir, tmp_path)
