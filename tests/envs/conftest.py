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
