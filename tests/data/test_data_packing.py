"""Batch plans and the collator: packed rows must compute exactly what separate examples compute."""

from __future__ import annotations

import random

import pytest
import torch

from posttrain.data.packing import IGNORE_INDEX, collate, pack_rows, plan_batches
from posttrain.data.sft import TokenizedExample


def make_examples(n=7, vocab=100, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(3, 20)
        prompt = rng.randint(1, length - 2)
        out.append(TokenizedExample([rng.randrange(1, vocab) for _ in range(length)],
                                    [0] * prompt + [1] * (length - prompt)))
    return out


def tiny_llama(attn: str):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = attn
    return transformers.LlamaForCausalLM(cfg).eval()


def test_labels_by_hand():
    ex = [TokenizedExample([5, 6, 7, 8], [0, 0, 1, 1]), TokenizedExample([9, 10, 11], [0, 1, 1])]
    b = collate(ex, [0, 1], pack=True, seq_len=16)
    assert b.input_ids_BT.tolist() == [[5, 6, 7, 8, 9, 10, 11]]
    assert b.labels_BT.tolist() == [[IGNORE_INDEX, 7, 8, IGNORE_INDEX, 10, 11, IGNORE_INDEX]]
    assert b.position_ids_BT.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert b.attention_mask_BT is None and (b.num_loss_tokens, b.num_real_tokens) == (4, 7)
    p = collate(ex, [0, 1], pack=False, seq_len=16, pad_id=0)
    assert p.input_ids_BT.tolist() == [[5, 6, 7, 8], [9, 10, 11, 0]]
    assert p.labels_BT.tolist() == [[IGNORE_INDEX, 7, 8, IGNORE_INDEX], [10, 11, IGNORE_INDEX, IGNORE_INDEX]]
    assert p.attention_mask_BT.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert (p.num_loss_tokens, p.num_real_tokens) == (4, 7)


def test_multi_document_example_gets_no_cross_document_label():
    ex = TokenizedExample([1, 2, 3, 4, 5], [1] * 5, position_ids=[0, 1, 2, 0, 1])
    b = collate([ex], [0], pack=False, seq_len=8)
    assert b.labels_BT.tolist() == [[2, 3, IGNORE_INDEX, 5, IGNORE_INDEX]]
    assert b.attention_mask_BT is None  # boundaries come from the position restarts


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_separate_logits(attn):
    model = tiny_llama(attn)
    examples = make_examples()
    batch = collate(examples, list(range(len(examples))), pack=True, seq_len=48)
    assert batch.input_ids_BT.shape[0] < len(examples)  # several examples really share rows
    with torch.no_grad():
        packed = model(**batch.model_inputs()).logits
        for r in range(batch.input_ids_BT.shape[0]):
            pos = batch.position_ids_BT[r].tolist()
            starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
            for s, e in zip(starts, starts[1:]):
                if batch.labels_BT[r, s:e].eq(IGNORE_INDEX).all() and batch.input_ids_BT[r, s:e].eq(0).all():
                    continue  # the padding tail
                alone = model(input_ids=batch.input_ids_BT[r:r + 1, s:e]).logits
                torch.testing.assert_close(packed[r, s:e], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_and_padded_give_the_same_loss(attn):
    model = tiny_llama(attn)
    examples = make_examples(seed=1)
    idx = list(range(len(examples)))

    def loss_sum(batch):
        logits = model(**batch.model_inputs()).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels_BT.flatten(),
                                                 ignore_index=IGNORE_INDEX, reduction="sum")

    with torch.no_grad():
        packed, padded = collate(examples, idx, pack=True, seq_len=40), collate(examples, idx, pack=False, seq_len=40)
        assert packed.num_loss_tokens == padded.num_loss_tokens
        torch.testing.assert_close(loss_sum(packed), loss_sum(padded), atol=1e-4, rtol=1e-6)


def test_plan_is_deterministic_and_respects_budgets():
    rng = random.Random(0)
    lengths = [rng.randint(5, 60) for _ in range(200)]
    a = plan_batches(lengths, tokens_per_batch=256, pack=True, seed=3, epoch=1)
    assert a == plan_batches(lengths, tokens_per_batch=256, pack=True, seed=3, epoch=1)
    assert a != plan_batches(lengths, tokens_per_batch=256, pack=True, seed=3, epoch=2)
    assert a != plan_batches(lengths, tokens_per_batch=256, pack=True, seed=4, epoch=1)
    for pack in (True, False):
        plan = plan_batches(lengths, tokens_per_batch=256, pack=pack, seed=0, epoch=0)
        assert sorted(i for b in plan for i in b) == list(range(200))  # each example once per epoch
        for b in plan:
            cost = sum(lengths[i] for i in b) if pack else len(b) * max(lengths[i] for i in b)
            assert cost <= 256
    with pytest.raises(ValueError, match="longer than tokens_per_batch"):
        plan_batches([10, 300], tokens_per_batch=256, pack=True, seed=0, epoch=0)


def test_pack_rows_first_fit_decreasing():
    assert pack_rows([6, 5, 4, 3, 2], 10) == [[0, 2], [1, 3, 4]]
    with pytest.raises(ValueError, match="more than seq_len"):
        collate(make_examples(), [0, 1], pack=True, seq_len=2)
