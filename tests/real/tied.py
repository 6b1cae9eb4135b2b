"""The tied-embedding probe shared by the engine tests: a trainer one full fine-tuning step past the
base (which moves the embedding, and with it the tied lm_head), the trainer's own log-probs of an
engine's samples, and the model an engine would be if it took the new embedding but kept the old
lm_head (a stale tie): the figure the probe must tell apart from the trainer's."""

from __future__ import annotations

import copy

import torch

from posttrain.rollout import SamplingParams
from tests.real.test_smollm2 import QUESTIONS, _train_step, encode, trainer_logprobs


def stepped(base, tokenizer, lr: float = 1e-3):
    """A copy of ``base`` after one AdamW step of full fine-tuning (the embedding moves)."""
    trainer = copy.deepcopy(base)
    _train_step(trainer, tokenizer, lr=lr)
    assert trainer.lm_head.weight is trainer.model.embed_tokens.weight
    assert not torch.equal(trainer.model.embed_tokens.weight, base.model.embed_tokens.weight)
    return trainer


def stale_head(trainer, base):
    """``trainer`` with its tie cut and lm_head put back to ``base``'s: what a sync that updated
    embed_tokens but not the tied head leaves in an engine."""
    stale = copy.deepcopy(trainer)
    stale.config.tie_word_embeddings = False
    stale.lm_head.weight = torch.nn.Parameter(base.lm_head.weight.detach().clone())
    return stale


def probe_prompts(tokenizer, count: int = 2) -> list[list[int]]:
    return [encode(tokenizer, q) for q in QUESTIONS[:count]]


def probe_sampling(new: int = 16) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=new, seed=0)


def max_gap(model, prompts, completions, logprobs) -> float:
    """Largest |model's log-prob - the engine's| over the sampled tokens."""
    return max(float((trainer_logprobs(model, p, c) - torch.tensor(lp)).abs().max())
               for p, c, lp in zip(prompts, completions, logprobs))
