"""Token selection for a batch of next-token logits, and stop-string detection.

`sample_next` is batched over rows with no Python loop over samples. Order of the warpers follows
the usual one (temperature, then top-k, then top-p). With top-k on, top-p is applied among the k
survivors only, so the full-vocabulary sort is skipped. The token is drawn by inverting the CDF
with one uniform number per row that the caller supplies: the engine draws each prompt's numbers
from that prompt's own generator (`uniforms`), so a seeded prompt samples the same tokens whatever
else shares its batch.

Top-p keeps a token when the probability mass of the tokens strictly more likely than it is below
``top_p`` (the most likely token is always kept), i.e. the smallest prefix of the sorted
distribution whose mass reaches ``top_p``.

`StopChecker` finds stop strings without decoding every row at every step: a per-vocabulary table
marks the tokens that could complete a stop string (their text contains the last character of
some stop string, is empty, or holds an incomplete UTF-8 sequence); only rows that just produced
such a token have their recent tail decoded and searched.
"""

from __future__ import annotations

import torch

from posttrain.rollout.types import SamplingParams


def truncate_logits(scaled_BV: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Apply top-k then top-p to temperature-scaled logits.

    Returns ``(candidates_BK, index_BK)``: the surviving logits (others -inf) and, when top-k is on,
    the vocabulary index of each column (``None`` means the columns are the vocabulary itself).
    """
    index = None
    if top_k > 0 and top_k < scaled_BV.shape[-1]:
        scaled_BV, index = scaled_BV.topk(top_k, dim=-1)  # sorted, descending
        sorted_vals = scaled_BV
    elif top_p < 1.0:
        sorted_vals, index = scaled_BV.sort(dim=-1, descending=True)
        scaled_BV = sorted_vals
    if top_p < 1.0:
        probs = sorted_vals.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        scaled_BV = scaled_BV.masked_fill(mass_before >= top_p, float("-inf"))
    return scaled_BV, index


def uniforms(seeds: list[int | None], n: int, steps: int) -> torch.Tensor:
    """(len(seeds) * n, steps) uniform numbers: sample j of prompt i takes row i*n + j, one column per
    decoding step. Each prompt's block comes from its own CPU generator seeded with its seed (a fresh
    random seed when None), drawn whole up front: a sample's numbers do not depend on the other
    prompts of the call, on how the call is chunked, or on which rows finished early."""
    blocks = []
    for seed in seeds:
        g = torch.Generator()
        g.manual_seed(seed) if seed is not None else g.seed()
        blocks.append(torch.rand(n, steps, generator=g))
    return torch.cat(blocks)


def _inverse_cdf_draw(probs_BK: torch.Tensor, u_B: torch.Tensor) -> torch.Tensor:
    """One draw per row by inverting the CDF with the row's uniform number ``u_B``, where
    ``torch.multinomial`` spends an exponential variate per vocabulary entry. Zero-probability
    entries can never be drawn (the CDF is flat across them). Returns (B, 1) column indices."""
    cdf = probs_BK.cumsum(-1)
    u = u_B.to(device=cdf.device, dtype=cdf.dtype)[:, None]
    col = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return col.clamp_(max=probs_BK.shape[-1] - 1)


def sample_next(
    logits_BV: torch.Tensor, sampling: SamplingParams, u_B: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose one token per row, with ``u_B`` (B,) uniform numbers in [0, 1) (None when greedy).

    Returns ``(token_B, logp_B, truncated_logp_B)`` where ``logp_B`` is the log-prob of the token
    under ``log_softmax(logits / T)`` over the full vocabulary (``log_softmax(logits)`` for greedy)
    and ``truncated_logp_B`` the log-prob under the distribution actually sampled from.
    """
    logits_BV = logits_BV.float()
    if sampling.greedy:
        token = logits_BV.argmax(-1)
        logp = logits_BV.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
        return token, logp, torch.zeros_like(logp)
    scaled = logits_BV if sampling.temperature == 1.0 else logits_BV / sampling.temperature
    full_logp_BV = scaled.log_softmax(-1)
    if 0 < sampling.top_k < scaled.shape[-1] or sampling.top_p < 1.0:
        cand_BK, index_BK = truncate_logits(scaled, sampling.top_k, sampling.top_p)
        cand_logp_BK = cand_BK.log_softmax(-1)
    else:  # nothing truncated: the sampled distribution is the full one, computed once
        cand_logp_BK, index_BK = full_logp_BV, None
    col = _inverse_cdf_draw(cand_logp_BK.exp(), u_B)
    token = col.squeeze(-1) if index_BK is None else index_BK.gather(-1, col).squeeze(-1)
    logp = full_logp_BV.gather(-1, token[:, None]).squeeze(-1)
    truncated = cand_logp_BK.gather(-1, col).squeeze(-1)
    return token, logp, truncated


class TokenTexts:
    """Each token's text decoded alone, once per tokenizer (~150k decodes for a large vocabulary),
    indexed by character: a new list of stop strings then costs a lookup per last character, not
    a pass over the vocabulary."""

    def __init__(self, tokenizer, vocab_size: int):
        self.vocab_size = vocab_size
        self.unsure_V = torch.ones(vocab_size, dtype=torch.bool)  # beyond the tokenizer: always checked
        by_char: dict[str, list[int]] = {}
        for tid in range(min(vocab_size, len(tokenizer))):
            text = tokenizer.decode([tid], skip_special_tokens=False)
            # empty or a partial UTF-8 sequence: what it adds shows only next to its neighbours
            self.unsure_V[tid] = (not text) or ("\ufffd" in text)
            for c in set(text):
                by_char.setdefault(c, []).append(tid)
        self.by_char = {c: torch.tensor(ids) for c, ids in by_char.items()}

    def containing(self, chars: set[str]) -> torch.Tensor:
        """(V,) bool: the tokens whose text holds one of ``chars``, or whose text is unsure."""
        table = self.unsure_V.clone()
        for c in chars:
            if c in self.by_char:
                table[self.by_char[c]] = True
        return table


class StopChecker:
    """Detects stop strings in generated token sequences (see the module docstring)."""

    def __init__(self, tokenizer, stops: list[str], vocab_size: int, texts: TokenTexts | None = None):
        self.tokenizer = tokenizer
        self.stops = list(stops)
        longest = max(len(s) for s in self.stops)
        # A token adds at least one character unless it is a partial UTF-8 sequence; the margin
        # covers those and tokenizers that join pieces with spaces.
        self.tail_tokens = longest + 8
        self.candidate_V = self._candidate_table(vocab_size, texts)

    def _candidate_table(self, vocab_size: int, texts: TokenTexts | None) -> torch.Tensor:
        last_chars = {s[-1] for s in self.stops}
        if any(c.isspace() for c in last_chars):
            # Tokenizers that encode a leading space in the token (sentencepiece) drop it when a
            # single token is decoded, so the table cannot be trusted: check every row.
            return torch.ones(vocab_size, dtype=torch.bool)
        return (texts or TokenTexts(self.tokenizer, vocab_size)).containing(last_chars)

    def rows_to_check(self, token_B: torch.Tensor) -> torch.Tensor:
        return self.candidate_V[token_B]

    def hits(self, completion_ids: list[int]) -> bool:
        """Whether the tail of the completion contains a stop string."""
        tail = self.tokenizer.decode(completion_ids[-self.tail_tokens :], skip_special_tokens=False)
        return any(s in tail for s in self.stops)

    def cut(self, completion_ids: list[int]) -> str:
        """Decoded text cut right after the earliest-ending stop string (whole text if none)."""
        text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        ends = [text.find(s) + len(s) for s in self.stops if s in text]
        return text[: min(ends)] if ends else text
