"""Token ids and loss masks for SFT, and packed chunks of raw text for mid-training.

`tokenize_sft` renders each example (see `posttrain.data.chat`) and keeps the loss on the
replies. An example longer than ``max_len`` is **dropped** by default (``overflow="drop"``):
truncating would cut the end of the reply and the stop token, teaching the model to ramble. With
``overflow="truncate"`` it is cut to ``max_len`` instead. Either way the count is logged as a
warning and returned by `tokenize_sft_report`. Examples left with no loss tokens are dropped.

`tokenize_raw_text` is for mid-training / continued pretraining: every token is a target,
documents are joined by EOS into one stream cut into ``seq_len`` chunks, and each chunk records
where its documents start (``position_ids`` restart at 0 there). The collator turns those restarts
into a block-diagonal attention mask and never asks a token to predict the next document's first
token.
"""

from __future__ import annotations

import dataclasses
import logging

from posttrain.data.chat import conversation_pieces, encode_with_mask, render_with_spans
from posttrain.data.records import SFTExample

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TokenizedExample:
    """One training sequence.

    ``loss_mask[t] == 1`` means token ``t`` is a target (predicted from tokens ``< t``).
    ``position_ids`` is None for a single document (positions ``0..n-1``); otherwise it restarts
    at 0 at each document start, and attention must not cross those starts.
    """

    input_ids: list[int]
    loss_mask: list[int]
    position_ids: list[int] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclasses.dataclass
class TokenizeReport:
    """What `tokenize_sft` did: kept examples, and how many were too long or had nothing to learn."""

    kept: int = 0
    too_long: int = 0
    truncated: int = 0
    no_loss_tokens: int = 0


def tokenize_sft_report(examples: list[SFTExample], tokenizer, *, max_len: int, use_chat_template: bool,
                        overflow: str = "drop") -> tuple[list[TokenizedExample], TokenizeReport]:
    """`tokenize_sft` plus the counts of what was dropped or cut."""
    if overflow not in ("drop", "truncate"):
        raise ValueError(f"overflow must be 'drop' or 'truncate', got {overflow!r}")
    out, report = [], TokenizeReport()
    for text, spans in _texts(examples, tokenizer, use_chat_template):
        ids, mask = encode_with_mask(tokenizer, text, spans, use_chat_template=use_chat_template)
        if len(ids) > max_len:
            report.too_long += 1
            if overflow == "drop":
                continue
            ids, mask = ids[:max_len], mask[:max_len]
            report.truncated += 1
        # The first token is never a target (nothing precedes it), so it does not count.
        if sum(mask[1:]) == 0:
            report.no_loss_tokens += 1
            continue
        out.append(TokenizedExample(ids, mask))
    report.kept = len(out)
    return out, report


def _texts(examples: list[SFTExample], tokenizer, use_chat_template: bool):
    """Each example's text and reply spans; a conversation whose template re-renders earlier turns
    gives one text per break (`conversation_pieces`)."""
    for ex in examples:
        if ex.messages is not None and use_chat_template:
            yield from conversation_pieces(tokenizer, ex.messages)
        else:
            yield render_with_spans(tokenizer, prompt=ex.prompt, completion=ex.completion,
                                    messages=ex.messages, use_chat_template=use_chat_template)


def tokenize_sft(examples: list[SFTExample], tokenizer, *, max_len: int, use_chat_template: bool,
                 overflow: str = "drop") -> list[TokenizedExample]:
    """Token ids and loss masks for SFT examples; logs a warning when any were dropped or cut."""
    out, report = tokenize_sft_report(examples, tokenizer, max_len=max_len,
                                      use_chat_template=use_chat_template, overflow=overflow)
    if report.too_long or report.no_loss_tokens:
        verb = "dropped" if overflow == "drop" else "truncated"
        log.warning("tokenize_sft: %d of %d examples longer than max_len=%d were %s; "
                    "%d dropped with no loss tokens", report.too_long, len(examples), max_len, verb,
                    report.no_loss_tokens)
    return out


def tokenize_raw_text(texts: list[str], tokenizer, *, seq_len: int) -> list[TokenizedExample]:
    """Documents joined by EOS and cut into ``seq_len`` chunks, loss on every token.

    The last chunk may be shorter; a final chunk of one token is dropped (nothing to predict).
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("mid-training needs a tokenizer with an EOS token to separate documents")
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    stream: list[int] = []
    doc_pos: list[int] = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        stream.extend(ids)
        doc_pos.extend(range(len(ids)))
    chunks = []
    for start in range(0, len(stream), seq_len):
        ids = stream[start:start + seq_len]
        if len(ids) < 2:
            continue
        # A document cut by the chunk boundary restarts at 0: RoPE only sees relative offsets,
        # and the chunk cannot attend to the part it lost anyway.
        pos = list(doc_pos[start:start + seq_len])
        first_restart = next((i for i, p in enumerate(pos) if p == 0), len(pos))
        pos[:first_restart] = range(first_restart)
        chunks.append(TokenizedExample(ids, [1] * len(ids), pos))
    return chunks
