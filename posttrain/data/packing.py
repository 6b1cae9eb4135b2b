"""Batches for SFT and mid-training: packed (no padding) or padded, and the collator.

**Packing without cross-talk.** Packed rows hold several examples back to back. Each example's
``position_ids`` restart at 0, and no attention mask is passed: transformers (5.x,
``masking_utils.find_packed_sequence_indices``) then reads the restarts as sequence boundaries
and builds a block-diagonal causal mask, for ``sdpa`` and ``eager`` alike. That detection only
runs when the model has **no KV cache** — and Llama's ``use_cache`` defaults to True from the
config, even in training mode, which silently lets packed examples attend to each other. So call
the model with `SFTBatch.model_inputs`, which sets ``use_cache=False``. Tests check that a packed
row's logits equal each example's logits run alone.

**Labels are already shifted.** ``labels_BT[b, t]`` is the target for the logits at position
``t`` (the next token, or -100). Compute cross-entropy on ``logits_BTV`` directly, or pass them to
a transformers model as ``shift_labels=``, never as ``labels=`` (that shifts again). Targets never
cross an example boundary: the last token of each example has label -100.

**Plans are deterministic.** `plan_batches` shuffles with ``(seed, epoch)``, so a resumed run can
rebuild the same plan and skip the first N batches.

Budgets: a packed batch holds at most ``tokens_per_batch`` real tokens; a padded batch holds at
most ``tokens_per_batch`` tokens *including padding* (rows × longest row), the same memory and
compute budget per step.
"""

from __future__ import annotations

import dataclasses
import random

import torch

from posttrain.data.sft import TokenizedExample

IGNORE_INDEX = -100


@dataclasses.dataclass
class SFTBatch:
    """A collated batch. Shapes: B rows, T positions.

    - ``input_ids_BT``     (B, T) long; padding is ``pad_id``.
    - ``labels_BT``        (B, T) long; next-token target for each position, -100 where no loss.
    - ``position_ids_BT``  (B, T) long; restart at 0 at each packed example (and at padding).
    - ``attention_mask_BT`` (B, T) long or None; set in padded mode (1 = real token). None in
      packed mode, where boundaries come from ``position_ids_BT``.
    - ``num_loss_tokens``  labels != -100, the denominator for a per-token mean loss.
    - ``num_real_tokens``  non-padding tokens.
    """

    input_ids_BT: torch.Tensor
    labels_BT: torch.Tensor
    position_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor | None
    num_loss_tokens: int
    num_real_tokens: int

    def model_inputs(self) -> dict:
        """Keyword arguments for a transformers causal LM (``use_cache=False``: see module docstring)."""
        kwargs = {"input_ids": self.input_ids_BT, "position_ids": self.position_ids_BT, "use_cache": False}
        if self.attention_mask_BT is not None:
            kwargs["attention_mask"] = self.attention_mask_BT
        return kwargs

    def to(self, device) -> "SFTBatch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return dataclasses.replace(self, input_ids_BT=move(self.input_ids_BT), labels_BT=move(self.labels_BT),
                                   position_ids_BT=move(self.position_ids_BT),
                                   attention_mask_BT=move(self.attention_mask_BT))


def plan_batches(lengths: list[int], *, tokens_per_batch: int, pack: bool, seed: int,
                 epoch: int) -> list[list[int]]:
    """Example indices per batch, for one epoch, in shuffled order (deterministic in seed, epoch).

    Greedy in the shuffled order: a batch closes when the next example would break the budget
    (real tokens when packing; rows × longest row when padding).
    """
    too_long = [i for i, n in enumerate(lengths) if n > tokens_per_batch]
    if too_long:
        raise ValueError(f"{len(too_long)} examples are longer than tokens_per_batch={tokens_per_batch} "
                         f"(e.g. index {too_long[0]}, {lengths[too_long[0]]} tokens)")
    order = list(range(len(lengths)))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    batches: list[list[int]] = []
    current: list[int] = []
    used = longest = 0
    for i in order:
        n = lengths[i]
        cost = used + n if pack else (len(current) + 1) * max(longest, n)
        if current and cost > tokens_per_batch:
            batches.append(current)
            current, used, longest = [], 0, 0
        current.append(i)
        used += n
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def pack_rows(lengths: list[int], seq_len: int) -> list[list[int]]:
    """First-fit decreasing: positions into ``lengths`` grouped into rows of at most ``seq_len``."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(seq_len - lengths[i])
    return rows


def _labels(ex: TokenizedExample) -> list[int]:
    """Next-token targets within one example; none across a document restart."""
    n = len(ex.input_ids)
    pos = ex.position_ids
    labels = [IGNORE_INDEX] * n
    for t in range(n - 1):
        if ex.loss_mask[t + 1] and (pos is None or pos[t + 1] != 0):
            labels[t] = ex.input_ids[t + 1]
    return labels


def _row(members: list[TokenizedExample], width: int, pad_id: int) -> tuple[list[int], list[int], list[int]]:
    ids, labels, pos = [], [], []
    for ex in members:
        ids += ex.input_ids
        labels += _labels(ex)
        pos += ex.position_ids if ex.position_ids is not None else list(range(len(ex)))
    pad = width - len(ids)
    # Padding restarts positions at 0, so packed detection treats it as one more (ignored) sequence.
    return ids + [pad_id] * pad, labels + [IGNORE_INDEX] * pad, pos + list(range(pad))


def collate(examples: list[TokenizedExample], indices: list[int], *, pack: bool, seq_len: int,
            pad_id: int = 0) -> SFTBatch:
    """Build an `SFTBatch` from ``examples[i] for i in indices``.

    ``pack=True``: examples are packed into rows of at most ``seq_len`` tokens (first-fit
    decreasing), no attention mask. ``pack=False``: one example per row, right-padded to the
    longest, with an attention mask — unless an example holds several documents (raw-text
    chunks), in which case the mask is left out so their position restarts keep them apart
    (right padding is harmless there: causal attention never looks ahead to it).
    """
    chosen = [examples[i] for i in indices]
    if not chosen:
        raise ValueError("collate needs at least one example")
    long = [len(ex) for ex in chosen if len(ex) > seq_len]
    if long:
        raise ValueError(f"an example has {long[0]} tokens, more than seq_len={seq_len}")
    if pack:
        groups = [[chosen[k] for k in row] for row in pack_rows([len(ex) for ex in chosen], seq_len)]
    else:
        groups = [[ex] for ex in chosen]
    width = max(sum(len(ex) for ex in g) for g in groups)
    rows = [_row(g, width, pad_id) for g in groups]
    ids = torch.tensor([r[0] for r in rows], dtype=torch.long)
    labels = torch.tensor([r[1] for r in rows], dtype=torch.long)
    pos = torch.tensor([r[2] for r in rows], dtype=torch.long)
    real = torch.tensor([[1] * sum(len(ex) for ex in g) + [0] * (width - sum(len(ex) for ex in g))
                         for g in groups], dtype=torch.long)
    multi_doc = any(ex.position_ids is not None and ex.position_ids.count(0) > 1 for ex in chosen)
    mask = None if (pack or multi_doc) else real
    return SFTBatch(ids, labels, pos, mask, int((labels != IGNORE_INDEX).sum()), int(real.sum()))
