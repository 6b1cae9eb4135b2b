"""SmolLM2's real BPE tokenizer and ChatML template: multi-turn trajectories stay token-exact where
decode → re-encode is not the identity, thinking is off by default, and the trainer's packed rows
give the padded rows' log-probs on the real model (float32)."""

from __future__ import annotations

import copy

import pytest
import torch

from posttrain.envs import EpisodeLimits, run_episodes
from posttrain.envs.calculator import CalculatorEnv
from posttrain.envs.tools import format_call
from posttrain.outcome import OutcomeClass
from posttrain.rollout import Rollouts, SamplingParams
from tests.real.test_smollm2 import LOGPROB_TOL

pytestmark = pytest.mark.real


def letter_by_letter(tokenizer, text: str) -> list[int]:
    """``text`` as one token per character: ids a sampler may well draw (each is in the vocabulary)
    and that decode to ``text``, but not the ids the tokenizer gives ``text``."""
    return [i for c in text for i in tokenizer(c, add_special_tokens=False)["input_ids"]]


class LetterEngine:
    """Answers turn ``k`` of every episode with ``turns[k]``, sampled letter by letter and closed by
    ``<|im_end|>``; keeps each (prompt ids, completion ids) it produced."""

    version = 0

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, []
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, n, sampling):
        ids = []
        for p in prompts:
            turn = sum(1 for q, _ in self.calls if q == p[:len(q)])
            ids.append(letter_by_letter(self.tokenizer, self.turns[turn]) + [self.end])
            self.calls.append((list(p), ids[-1]))
        return Rollouts(prompt_idx=list(range(len(prompts))), prompt_ids=[list(p) for p in prompts], completion_ids=ids,
                        logprobs=[[-0.5] * len(c) for c in ids], finish_reason=["eos"] * len(ids),
                        policy_version=[0] * len(ids), sampling=sampling,
                        truncated_logprobs=[[-0.5] * len(c) for c in ids])


def test_decode_then_encode_is_not_the_identity_on_this_tokenizer(smollm2):
    _, tok = smollm2
    text = format_call("calculator", {"expression": "347 * 86"})
    sampled = letter_by_letter(tok, text)
    assert tok.decode(sampled) == text
    assert tok(text, add_special_tokens=False)["input_ids"] != sampled  # re-encoding merges the letters
    assert len(tok(text, add_special_tokens=False)["input_ids"]) < len(sampled)


def assert_token_exact(tok, engine: LetterEngine, episode) -> None:
    """The trajectory is the ids the model saw and sampled, never re-tokenised: each turn's prompt
    extends the last turn's prompt + completion by the template's ids for the environment's reply."""
    (seg,) = episode.segments
    calls = engine.calls
    assert len(calls) == episode.turns >= 2
    whole = seg.prompt_ids + seg.completion_ids
    assert calls[0][0] == seg.prompt_ids and calls[-1][0] + calls[-1][1] == whole
    mask = []
    for (p, c), (nxt, _) in zip(calls, calls[1:] + [(whole, None)]):
        assert nxt[:len(p) + len(c)] == p + c  # the sampled ids verbatim, letter by letter
        env = nxt[len(p) + len(c):]
        assert env == tok(tok.decode(env), add_special_tokens=False)["input_ids"]  # the template's text, encoded
        mask += [1] * len(c) + [0] * len(env)
    assert seg.loss_mask == mask and sum(mask) == sum(len(c) for _, c in calls)
    text = tok.decode(whole)
    assert text.count("<|im_start|>assistant\n") == len(calls) and tok(text, add_special_tokens=False)["input_ids"] != whole


def test_calculator_episode_is_token_exact(smollm2):
    _, tok = smollm2
    engine = LetterEngine(tok, [format_call("calculator", {"expression": "347 * 86"}), "Answer: 29842"])
    (ep,) = run_episodes(engine, tok, lambda: CalculatorEnv(), [{"prompt": "Solve: 347 × 86", "answer": "29842"}], 1,
                         SamplingParams(), EpisodeLimits(max_turns=4, max_total_tokens=2048))
    assert ep.outcome.cls is OutcomeClass.PASS and ep.messages[-2]["content"] == "29842"
    assert_token_exact(tok, engine, ep)


def test_repository_episode_is_token_exact(smollm2):
    from posttrain.envs.repo import RepoEnv
    from posttrain.envs.repo_tasks import sample_tasks
    from tests.envs.pools import start_pool

    _, tok = smollm2
    (task,) = sample_tasks(1, split="train")
    fix = format_call("replace", {"path": task["bug"]["path"], "old": task["bug"]["old"], "new": task["bug"]["new"]})
    engine = LetterEngine(tok, [format_call("list_files", {}), fix + format_call("submit", {})])
    pool = start_pool(workers=1, timeout_s=10.0)
    try:
        (ep,) = run_episodes(engine, tok, lambda: RepoEnv(pool=pool), [task], 1, SamplingParams(),
                             EpisodeLimits(max_turns=4, max_total_tokens=4096))
    finally:
        pool.close()
    assert ep.outcome.cls is OutcomeClass.PASS, ep.outcome
    assert_token_exact(tok, engine, ep)


def test_thinking_is_off_by_default_in_the_chat_template(smollm2):
    """SmolLM2's template has no thinking switch: the prompt every command renders (no
    ``enable_thinking`` passed) opens the assistant turn with no ``<think>`` block, and asking for
    thinking off renders the same text."""
    from posttrain.data.chat import render_prompt
    from posttrain.rl.config import RLDataConfig

    _, tok = smollm2
    default = render_prompt(tok, "What is 2 + 2?", True, RLDataConfig().thinking)
    assert default.endswith("<|im_start|>assistant\n") and "<think>" not in default
    assert render_prompt(tok, "What is 2 + 2?", True, False) == default


def test_packed_rows_give_the_padded_rows_logprobs(smollm2):
    from posttrain.rl.batch import build_batch
    from tests.rl.test_packed import padded_and_packed_logp

    model, tok = smollm2
    questions = ["What is 17 + 25?", "Write a Python function that reverses a string.", "Name a colour."]
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True),
                   add_special_tokens=False)["input_ids"] for q in questions]
    replies = ["42", "def reverse(s):\n    return s[::-1]", "Blue is a colour I like a lot, and so is green."]
    completions = [tok(r + "<|im_end|>", add_special_tokens=False)["input_ids"] for r in replies]
    ro = Rollouts(prompt_idx=[0, 1, 2], prompt_ids=prompts, completion_ids=completions,
                  logprobs=[[-1.0] * len(c) for c in completions], finish_reason=["eos"] * 3,
                  policy_version=[0] * 3, sampling=SamplingParams())
    mb = build_batch(ro, [1.0] * 3, [True] * 3, pad_id=tok.pad_token_id)
    assert len(set(mb.attention_mask_BT.sum(1).tolist())) == 3  # ragged: the padded rows carry padding
    padded, packed = padded_and_packed_logp(copy.deepcopy(model), mb)
    gap = float((packed - padded)[mb.mask_BT].abs().max())
    # float32 rounding: the packed forward multiplies matrices of another shape (measured 1.05e-5);
    # attention leaking across rows, or positions not restarting, moves log-probs by far more
    assert mb.mask_BT.sum() == sum(len(c) for c in completions) and gap <= LOGPROB_TOL, gap
    assert torch.isfinite(packed[mb.mask_BT]).all()
