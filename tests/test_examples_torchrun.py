"""Every recipe in examples/ runs unchanged under `torchrun --nproc-per-node 2` and takes the steps
one process takes: the same losses and gradient norms on the same global batch.

Only paths (the nano model and small embedded data in place of the recipes' runs/ folders) and
sizes (steps, prompts, tokens) are overridden; the recipes' own knobs (grad_accum, batch_pairs,
dynamic sampling, PPO's epochs and mini-batches, environments, sandboxed verifiers) stay as written.
The arithmetic GRPO recipes also take a dense reward, so that the untrained nano model's groups
differ and their steps train (the exact-answer verifier gives it all zeros: every step starved).
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from posttrain.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

EVAL = "`posttrain eval` is not a training command: it runs in one process (docs/distributed.md)"
SEED = ("the seed's topology is one GPU serving vLLM beside one training, not torchrun ranks; "
        "tests/rl/test_seed_recipes.py runs it on CPU and against a vLLM server")
ENV_LANE = ("runs in its environment's own lane (tests/envs/test_env_examples.py); multi-turn environments "
            "at two ranks are grpo_calculator's and grpo_repo's here")
SKIP = {
    "eval_envs.yaml": EVAL, "seed_eval_direct.yaml": EVAL, "seed_eval_reasoning.yaml": EVAL,
    "seed_direct.yaml": SEED, "seed_reasoning.yaml": SEED,
    "grpo_openenv_guess.yaml": ENV_LANE, "grpo_verifiers_guess.yaml": ENV_LANE,
}

# With K > 0 which version samples a group depends on timing: K = 0 makes the runs comparable (the
# K = 1 run under torchrun, killed and resumed, is tests/rl/test_async_distributed.py's).
EXTRA = {"grpo_arith_async.yaml": ["max_staleness=0"]}

COMMAND = {"sft": "sft", "dpo": "dpo", "rm": "rm", "distill": "distill", "grpo": "rl", "ppo": "rl"}

DENSE = textwrap.dedent('''
    from posttrain.outcome import Outcome

    def letters(completion, example):
        """Fraction of letters: rewards that differ within a group even for an untrained model."""
        frac = sum(c.isalpha() for c in completion) / max(len(completion), 1)
        return Outcome.passed(reward=frac) if frac > 0.99 else Outcome.model_fail(reward=frac)
''')

# The sizes every run of a command is cut to (a few seconds a run on the nano model).
SIZES = {
    "sft": ["num_steps=2", "eval_every=0", "save_every=0", "data.eval_path="],
    "dpo": ["num_steps=2", "eval_every=0", "save_every=0"],
    "rm": ["num_steps=2", "eval_every=0", "save_every=0"],
    "rl": ["num_steps=2", "eval_every=0", "save_every=0", "data.eval_path=", "prompts_per_step=4",
           "rollout.max_new_tokens=16"],
    "distill": ["num_steps=2", "eval_every=0", "save_every=0", "data.eval_path=", "prompts_per_step=4",
                "rollout.max_new_tokens=16"],
}


SANDBOXED = {"grpo_code.yaml", "grpo_code_repair.yaml", "grpo_repo.yaml"}  # the code verifier and environment


# The environment and sandboxed-verifier recipes run from tests/test_examples_torchrun_envs.py: a file
# is one pytest-xdist worker's (--dist loadfile), and the recipes split in two keep both workers busy.
ENV_RECIPES = {"grpo_calculator.yaml", "grpo_code.yaml", "grpo_code_repair.yaml", "grpo_demo.yaml", "grpo_repo.yaml",
               "grpo_skyrl_gsm8k.yaml", "grpo_openenv_guess.yaml", "grpo_verifiers_guess.yaml"}


def example_names(envs: bool = False) -> list:
    """The recipes in examples/ (with ``envs``: those of `ENV_RECIPES`, else the others)."""
    return [pytest.param(p.name, marks=pytest.mark.skip(reason=SKIP[p.name])) if p.name in SKIP else p.name
            for p in sorted(EXAMPLES.glob("*.yaml")) if (p.name in ENV_RECIPES) == envs]


@pytest.fixture(scope="module")
def inputs(nano_model_dir, arith_data_dir, tmp_path_factory):
    """The folders the recipes read, made small: data by the documented `make-data` / `make-env-data`
    commands, a reward model on the nano model, the dense reward module."""
    from posttrain.models.heads import load_reward_model
    from posttrain.models.hf import ModelConfig, load_tokenizer

    root = tmp_path_factory.mktemp("examples")
    made = {"arith": Path(arith_data_dir)}
    for name, argv in {"add": ["make-data", "arithmetic", "--ops", "+"], "code": ["make-data", "toy_code"],
                       "calc": ["make-env-data", "calculator", "--tools-style", "none"],
                       "repair": ["make-env-data", "code_repair"],
                       "repo": ["make-env-data", "repo", "--tools-style", "none"]}.items():
        assert main([*argv, str(root / name), "--n-train", "40", "--n-eval", "8"]) == 0
        made[name] = root / name
    gsm8k = root / "gsm8k.jsonl"
    gsm8k.write_text("".join(json.dumps({"prompt": f"What is {a} + {a}? End with #### and the number.",
                                         "answer": str(2 * a)}) + "\n" for a in range(1, 9)))
    rm = load_reward_model(ModelConfig(path=str(nano_model_dir)))
    rm.save_pretrained(root / "rm")
    load_tokenizer(str(nano_model_dir)).save_pretrained(root / "rm")
    (root / "plugin").mkdir()
    (root / "plugin" / "examples_dense_reward.py").write_text(DENSE)
    return {"model": Path(nano_model_dir), "gsm8k": gsm8k, "rm": root / "rm", "plugin": root / "plugin", **made}


def data_overrides(name: str, recipe: dict, inputs: dict) -> list[str]:
    """The recipe's paths pointed at ``inputs`` (the same file names, in the small folders)."""
    out = [f"model.path={inputs['model']}", "logging.progress=false"]
    folder = {"sft_arith": "arith", "sft_calculator": "calc", "dpo_arith": "add", "rm_arith": "add",
              "ppo_arith": "add", "grpo_code": "code", "grpo_calculator": "calc", "grpo_code_repair": "repair",
              "grpo_repo": "repo"}
    for key in ("path", "eval_path"):
        value = recipe.get("data", {}).get(key)
        if value and name == "grpo_skyrl_gsm8k":
            out.append(f"data.{key}={inputs['gsm8k']}")
        elif value:
            out.append(f"data.{key}={inputs[folder.get(name, 'arith')] / Path(value).name}")
    if "teacher" in recipe:
        out.append(f"teacher.path={inputs['model']}")
    if "reward_model" in recipe:
        out.append(f"reward_model.path={inputs['rm']}")
    if recipe.get("dynamic_sampling", {}).get("enabled"):
        out.append("verifier=examples_dense_reward:letters")
    return out


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("name", example_names())
def test_example_runs_at_two_ranks_as_in_one_process(name, inputs, tmp_path, torchrun, monkeypatch):
    run_at_two_ranks_and_one(name, inputs, tmp_path, torchrun, monkeypatch)


def run_at_two_ranks_and_one(name, inputs, tmp_path, torchrun, monkeypatch):
    """The recipe ``name`` in one process and at two ranks: the same steps, losses and gradient norms."""
    path = EXAMPLES / name
    recipe = yaml.safe_load(path.read_text())
    if name in SANDBOXED and not (shutil.which("bwrap") and os.geteuid() == 0):
        pytest.skip("the sandbox needs bubblewrap and root")
    if "skyrl:" in str(recipe.get("env", {}).get("name", "")):
        pytest.importorskip("skyrl_gym")
    command = COMMAND[name.split("_")[0]]
    monkeypatch.syspath_prepend(str(inputs["plugin"]))
    monkeypatch.setenv("PYTHONPATH", str(inputs["plugin"]))  # the ranks import the reward module too
    args = [str(path), *data_overrides(path.stem, recipe, inputs), *SIZES[command], *EXTRA.get(name, [])]
    assert main([command, *args, f"out_dir={tmp_path / 'one'}"]) == 0
    torchrun(2, command, *args, f"out_dir={tmp_path / 'two'}", timeout=600)
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert [m["step"] for m in two] == [m["step"] for m in one] and one[-1]["step"] == 2
    compared = 0
    for a, b in zip(one, two):
        for key in ("reward/mean", "loss", "grad_norm", "critic/loss", "eval/loss"):
            if key in a:
                assert key in b, (a["step"], key)
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=2e-6), (a["step"], key, a[key], b[key])
                compared += key in ("loss", "grad_norm")
    assert compared, "no step trained: the comparison would mean nothing"
