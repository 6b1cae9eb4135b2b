"""Preference pairs ``{prompt, chosen, rejected}``: validation, tokenization and padded batches.

Records come from any source `posttrain.data.records` reads (JSONL, Parquet, HF dataset folders);
``prompt`` is a string or a list of chat messages, ``chosen`` / ``rejected`` are the two replies.
Extra fields (``answer``...) ride along and are ignored here.

Bad pairs. A missing field is always an error naming ``file:line``. A pair whose ``chosen`` or
``rejected`` is empty (or only white space), or whose two replies are identical, carries no
preference to learn: with ``invalid="error"`` (the default) it is an error naming the line; with
``invalid="drop"`` it is dropped and counted (the count is returned and logged), which is what a
user wants for a large scraped set with a few broken rows.

Tokenization reuses the SFT path (`posttrain.data.chat`): prompt and reply are rendered together
(chat template or plain text), encoded once, and the loss mask marks the reply tokens and the
token that closes the reply. The sequence is then cut right after that closing token, so a pair
looks exactly like a rollout (prompt ids, reply ids, stop token) and a reward model trained on
pairs scores rollouts the way it scored its training data. A pair with either side longer than
``max_len`` is dropped and counted (cutting would remove the very end the reward model reads).

Batches: `collate_pairs` stacks the chosen rows first, then the rejected rows (2B rows), right
padded. ``mask_BT`` is target-aligned like `posttrain.rl.batch.RLBatch`: column t scores token
t + 1, so ``Σ logp_BT · mask_BT`` is the reply's log-probability.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from posttrain.config import ConfigValueError
from posttrain.data.chat import encode_with_mask, render_with_spans
from posttrain.data.records import PreferenceExample, load_records_with_location, parse_preference
from posttrain.errors import UserError

log = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class PreferenceDataConfig:
    path: str = ""
    """Training pairs: JSONL / Parquet / HF dataset folder of {prompt, chosen, rejected} records. Required."""
    eval_path: str = ""
    """Held-out pairs in the same format; empty = no held-out accuracy."""
    use_chat_template: bool = True
    """Render prompt and reply with the tokenizer's chat template (plain text otherwise)."""
    max_len: int = 256
    """Longest sequence (prompt + reply) in tokens; longer pairs are dropped and counted."""
    invalid: str = "error"
    """Pairs with an empty reply or chosen == rejected: error (stop, naming the line) or drop (count them)."""
    eval_max_pairs: int = 512
    """Use at most this many held-out pairs."""

    def __post_init__(self):
        if self.invalid not in ("error", "drop"):
            raise ConfigValueError("invalid", "must be error or drop")
        if self.max_len < 2:
            raise ConfigValueError("max_len", "must be >= 2")


@dataclasses.dataclass
class TokenizedPair:
    """Token ids of prompt + chosen and prompt + rejected, with their reply masks (1 = reply token)."""

    chosen_ids: list[int]
    chosen_mask: list[int]
    rejected_ids: list[int]
    rejected_mask: list[int]


@dataclasses.dataclass
class PairBatch:
    """B pairs as 2B right-padded rows: rows ``[0, B)`` chosen, rows ``[B, 2B)`` rejected.

    - ``input_ids_BT``      (2B, L) long, padded with the pad id
    - ``attention_mask_BT`` (2B, L) long, 1 on real tokens
    - ``mask_BT``           (2B, L-1) bool, target-aligned reply mask (column t scores token t+1)
    - ``pair_idx_B``        (B,) long, index of each pair in its dataset
    """

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    mask_BT: torch.Tensor
    pair_idx_B: torch.Tensor

    @property
    def num_pairs(self) -> int:
        return self.pair_idx_B.shape[0]


def check_pair(ex: PreferenceExample, where: str) -> str | None:
    """Why the pair teaches nothing (empty reply, identical replies), or None when it is usable."""
    for key in ("chosen", "rejected"):
        if not getattr(ex, key).strip():
            return f"{where}: field '{key}' is empty"
    if ex.chosen == ex.rejected:
        return f"{where}: 'chosen' and 'rejected' are identical (no preference to learn)"
    return None


def load_pairs(path: str | Path, invalid: str = "error") -> tuple[list[PreferenceExample], int]:
    """Validated pairs of ``path`` and how many were dropped (``invalid="drop"``)."""
    pairs, dropped = [], 0
    for where, record in load_records_with_location(path):
        ex = parse_preference(record, where)
        problem = check_pair(ex, where)
        if problem is None:
            pairs.append(ex)
        elif invalid == "drop":
            dropped += 1
        else:
            raise UserError(problem + " (set data.invalid=drop to skip such pairs)")
    if dropped:
        log.warning("%s: dropped %d pairs with an empty reply or chosen == rejected", path, dropped)
    if not pairs:
        raise UserError(f"{path}: no usable preference pairs")
    return pairs, dropped


def encode_reply(tokenizer, prompt, reply: str, *, use_chat_template: bool) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` of prompt + reply, ending with the token that closes the reply."""
    text, spans = render_with_spans(tokenizer, prompt=prompt, completion=reply,
                                    use_chat_template=use_chat_template)
    ids, mask = encode_with_mask(tokenizer, text, spans, use_chat_template=use_chat_template)
    last = max(i for i, m in enumerate(mask) if m)
    return ids[: last + 1], mask[: last + 1]


def tokenize_pairs(pairs: list[PreferenceExample], tokenizer, *, max_len: int,
                   use_chat_template: bool) -> tuple[list[TokenizedPair], int]:
    """Tokenized pairs and the number dropped for being longer than ``max_len``."""
    out, too_long = [], 0
    for ex in pairs:
        c_ids, c_mask = encode_reply(tokenizer, ex.prompt, ex.chosen, use_chat_template=use_chat_template)
        r_ids, r_mask = encode_reply(tokenizer, ex.prompt, ex.rejected, use_chat_template=use_chat_template)
        if max(len(c_ids), len(r_ids)) > max_len:
            too_long += 1
            continue
        out.append(TokenizedPair(c_ids, c_mask, r_ids, r_mask))
    if too_long:
        log.warning("dropped %d of %d pairs longer than max_len=%d", too_long, len(pairs), max_len)
    return out, too_long


def load_tokenized_pairs(cfg: PreferenceDataConfig, tokenizer, path: str) -> list[TokenizedPair]:
    """`load_pairs` + `tokenize_pairs` for a config; UserError when nothing fits ``max_len``."""
    pairs, _ = load_pairs(path, cfg.invalid)
    tokenized, _ = tokenize_pairs(pairs, tokenizer, max_len=cfg.max_len, use_chat_template=cfg.use_chat_template)
    if not tokenized:
        raise UserError(f"{path}: no pair fits data.max_len={cfg.max_len}")
    return tokenized


def collate_pairs(pairs: list[TokenizedPair], indices: list[int], pad_id: int) -> PairBatch:
    """A `PairBatch` of ``pairs[i] for i in indices`` (see the class for the layout)."""
    chosen = [(pairs[i].chosen_ids, pairs[i].chosen_mask) for i in indices]
    rejected = [(pairs[i].rejected_ids, pairs[i].rejected_mask) for i in indices]
    rows = chosen + rejected
    width = max(len(ids) for ids, _ in rows)
    ids_BT = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn_BT = torch.zeros((len(rows), width), dtype=torch.long)
    mask_BT = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    for r, (ids, mask) in enumerate(rows):
        ids_BT[r, : len(ids)] = torch.tensor(ids)
        attn_BT[r, : len(ids)] = 1
        mask_BT[r, : len(ids) - 1] = torch.tensor(mask[1:], dtype=torch.bool)
    return PairBatch(ids_BT, attn_BT, mask_BT, torch.tensor(list(indices), dtype=torch.long))


def batch_indices(num_pairs: int, batch_pairs: int, seed: int, step: int) -> list[int]:
    """Pairs of optimizer step ``step`` (0-based): epochs are seeded shuffles, read in order.

    A pure function of its arguments, so a resumed run sees the batches an uninterrupted one would.
    """
    start = step * batch_pairs
    out: list[int] = []
    while len(out) < batch_pairs:
        epoch, offset = divmod(start + len(out), num_pairs)
        order = torch.randperm(num_pairs, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.extend(order[offset: offset + batch_pairs - len(out)].tolist())
    return out
