"""Every training command on every model family `posttrain make-tiny` builds (Llama, Qwen3, Mistral,
Phi-3, Gemma 2, Gemma 3), the way a user runs them: the recipes in examples/, pointed at a nano
model of the family (a teacher of the same family for distillation), two steps each; and SFT and
GRPO at two ranks under torchrun equal to one process. Slow: ~6 families x 8 runs."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml

from posttrain.cli import main
from posttrain.models import tiny
from tests.test_examples_torchrun import COMMAND, DENSE, EXAMPLES, EXTRA, SIZES, data_overrides

RECIPES = ["sft_arith.yaml", "dpo_arith.yaml", "rm_arith.yaml", "grpo_arith.yaml", "grpo_arith_async.yaml",
           "ppo_arith.yaml", "distill_arith.yaml"]
pytestmark = pytest.mark.slow
# transformers has no per-token (token-classification) model for Gemma 3, which PPO's critic is
REFUSED = {("gemma3", "ppo_arith.yaml"): "no token-classification (per-token value) model for model type 'gemma3_text'"}


@pytest.fixture(scope="module")
def family_inputs(arith_data_dir, tmp_path_factory):
    """Per family: a nano model and a reward model of that family; the recipes' data, made once."""
    from posttrain.models.heads import load_reward_model
    from posttrain.models.hf import ModelConfig, load_tokenizer

    root = tmp_path_factory.mktemp("families")
    original = tiny.build_tokenizer
    tiny.build_tokenizer = functools.cache(original)  # one tokenizer for every family (same seed, same one)
    try:
        models = {arch: tiny.build_tiny(root / arch, "nano", seed=0, arch=arch) for arch in tiny.ARCHS}
    finally:
        tiny.build_tokenizer = original
    rms = {}
    for arch, path in models.items():
        rm = load_reward_model(ModelConfig(path=str(path)))
        rm.save_pretrained(root / f"rm-{arch}")
        load_tokenizer(str(path)).save_pretrained(root / f"rm-{arch}")
        rms[arch] = root / f"rm-{arch}"
    assert main(["make-data", "arithmetic", "--ops", "+", str(root / "add"), "--n-train", "40", "--n-eval", "8"]) == 0
    (root / "plugin").mkdir()
    (root / "plugin" / "examples_dense_reward.py").write_text(DENSE)
    return {"models": models, "rms": rms, "arith": Path(arith_data_dir), "add": root / "add", "plugin": root / "plugin"}


def _args(name: str, arch: str, inputs: dict) -> tuple[str, list[str]]:
    recipe = yaml.safe_load((EXAMPLES / name).read_text())
    command = COMMAND[name.split("_")[0]]
    shared = {"model": inputs["models"][arch], "rm": inputs["rms"][arch], "arith": inputs["arith"],
              "add": inputs["add"], "gsm8k": None}
    args = [str(EXAMPLES / name), *data_overrides(Path(name).stem, recipe, shared), *SIZES[command],
            *EXTRA.get(name, [])]
    return command, args


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("arch", list(tiny.ARCHS))
def test_every_command_runs_on_every_family(arch, name, family_inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(family_inputs["plugin"]))
    command, args = _args(name, arch, family_inputs)
    if (arch, name) in REFUSED:  # refused at start, in one line, before anything is written
        assert main([command, *args, f"out_dir={tmp_path / 'run'}"]) == 2
        assert REFUSED[arch, name] in capsys.readouterr().err and not (tmp_path / "run" / "metrics.jsonl").exists()
        return
    assert main([command, *args, f"out_dir={tmp_path / 'run'}"]) == 0
    rows = _rows(tmp_path / "run")
    assert rows[-1]["step"] == 2
    trained = [r for r in rows if "loss" in r]
    assert trained and all(r["loss"] == r["loss"] for r in trained)  # finite (NaN != NaN)
    if command in ("rl", "distill"):  # the engine sampled what the trainer scores
        worst = max(r.get("mismatch/logprob_abs_diff_max", 0.0) for r in rows)
        assert worst < 1e-4, worst


@pytest.mark.parametrize("name", ["sft_arith.yaml", "grpo_arith.yaml"])
@pytest.mark.parametrize("arch", list(tiny.ARCHS))
def test_two_ranks_equal_one_process_on_every_family(arch, name, family_inputs, tmp_path, torchrun, monkeypatch):
    monkeypatch.syspath_prepend(str(family_inputs["plugin"]))
    monkeypatch.setenv("PYTHONPATH", str(family_inputs["plugin"]))  # the ranks import the reward module too
    command, args = _args(name, arch, family_inputs)
    assert main([command, *args, f"out_dir={tmp_path / 'one'}"]) == 0
    torchrun(2, command, *args, f"out_dir={tmp_path / 'two'}", timeout=600)
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two]
    compared = 0
    for a, b in zip(one, two):
        for key in ("loss", "grad_norm", "reward/mean"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=2e-6), (arch, a["step"], key)
                compared += 1
    assert compared


@pytest.mark.parametrize("arch", list(tiny.ARCHS))
def test_serve_answers_the_openai_client_on_every_family(arch, family_inputs):
    """`posttrain serve`'s app on the family's model: a chat completion through the openai client is
    the engine's greedy completion of the family's own chat template, token for token."""
    import openai

    from posttrain.models.hf import load_tokenizer
    from posttrain.rollout import SamplingParams, TorchEngine
    from tests.serve.conftest import SERVED_NAME, make_server

    path = str(family_inputs["models"][arch])
    tokenizer = load_tokenizer(path)
    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "Solve: 3 + 4"}]
    prompt = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"]
    ref = TorchEngine(path, tokenizer=tokenizer).generate([prompt], 1, SamplingParams(temperature=0.0, max_new_tokens=12))
    with make_server(path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        chat = client.chat.completions.create(model=SERVED_NAME, messages=messages, max_tokens=12, temperature=0,
                                              logprobs=True, extra_body={"return_token_ids": True})
    c = chat.choices[0]
    assert c.prompt_token_ids == prompt and c.token_ids == ref.completion_ids[0]
    assert c.message.content == ref.texts[0]
    assert [t.logprob for t in c.logprobs.content] == ref.logprobs[0]
