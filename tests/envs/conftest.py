"""Environment test fixtures: the nano model's tokenizer and engine, and a scripted engine whose
turns are chosen by the test (so faults can be provoked on purpose)."""

from __future__ import annotations

import pytest

from posttrain.rollout.types import Rollouts


class ScriptedEngine:
    """A `RolloutEngine` that answers each prompt with ``script(prompt_text, turn_index)`` + ``end``.

    Records every prompt it was given (as ids), so a test can check what the model conditioned on.
    Log-probs are -0.5 per token."""

    version = 0

    def __init__(self, tokenizer, script, end: str = "<|im_end|>"):
        self.tokenizer, self.script = tokenizer, script
        self.end = tokenizer.convert_tokens_to_ids(end)
        self.prompts: list[list[int]] = []

    def generate(self, prompts, n, sampling):
        ids, rows = [], []
        for i, p in enumerate(prompts):
            for _ in range(n):
                self.prompts.append(list(p))
                text = self.script(self.tokenizer.decode(p), i)
                ids.append(self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.end])
                rows.append(i)
        return Rollouts(prompt_idx=rows, prompt_ids=[list(prompts[i]) for i in rows], completion_ids=ids,
                        logprobs=[[-0.5] * len(c) for c in ids], finish_reason=["eos"] * len(ids),
                        policy_version=[0] * len(ids), sampling=sampling,
                        truncated_logprobs=[[-0.5] * len(c) for c in ids])


def drop_old_thinking(tokenizer):
    """A copy of the tokenizer whose template drops <think>...</think> from earlier assistant turns
    (as Qwen3's does): the history it renders is not the concatenation the model saw."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and '</think>' in m['content'] %}{{ m['content'].split('</think>')[-1] }}"
        "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


@pytest.fixture(scope="session")
def nano_tokenizer(nano_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(nano_model_dir)


@pytest.fixture
def scripted(nano_tokenizer):
    return lambda script: ScriptedEngine(nano_tokenizer, script)


def rl_then_eval(model_dir, data, env: str, tmp_path) -> tuple[dict, dict]:
    """Two GRPO steps with held-out eval against ``env`` (a YAML mapping), then `posttrain eval` of
    the trained model on the same data: the last metrics row and the eval result."""
    import json

    from posttrain.cli import main

    run, out = tmp_path / "run", tmp_path / "eval"
    assert main(["rl", "algorithm=grpo", f"model.path={model_dir}", f"data.path={data}", f"data.eval_path={data}",
                 "num_steps=2", "eval_every=2", "save_every=0", "prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=4", f"env={env}", "logging.progress=false", f"out_dir={run}"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert main(["eval", "benchmarks=[{kind: env, name: guess, path: " + str(data) + ", env: " + env + "}]",
                 "profiles=[{name: sampled, temperature: 1.0, n: 2, max_new_tokens: 4}]", f"model={run}",
                 f"out_dir={out}", "--no-progress"]) == 0
    (result,) = json.loads((out / "eval.json").read_text())["results"]
    return rows[-1], result
