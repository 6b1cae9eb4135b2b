"""Preference pairs: validation errors naming file:line, drop mode, tokenization, batches."""

import json

import pytest

from posttrain.data.preference import (batch_indices, collate_pairs, encode_reply, load_pairs,
                                       tokenize_pairs)
from posttrain.data.records import PreferenceExample
from posttrain.errors import UserError


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = {"prompt": "Solve: 2 + 2", "chosen": "Answer: 4", "rejected": "Answer: 5"}


@pytest.mark.parametrize("bad,needle", [
    ({"prompt": "p", "chosen": "a"}, "pairs.jsonl:2: missing field 'rejected'"),
    ({"prompt": "p", "chosen": "  ", "rejected": "b"}, "pairs.jsonl:2: field 'chosen' is empty"),
    ({"prompt": "p", "chosen": "same", "rejected": "same"}, "pairs.jsonl:2: 'chosen' and 'rejected' are identical"),
    ({"chosen": "a", "rejected": "b"}, "pairs.jsonl:2: missing field 'prompt'"),
])
def test_bad_pairs_name_the_line(tmp_path, bad, needle):
    path = write(tmp_path / "pairs.jsonl", [GOOD, bad])
    with pytest.raises(UserError, match=needle):
        load_pairs(path)


def test_drop_mode_counts_unusable_pairs_but_not_missing_fields(tmp_path):
    rows = [GOOD, {**GOOD, "chosen": ""}, {**GOOD, "rejected": GOOD["chosen"]}, GOOD]
    pairs, dropped = load_pairs(write(tmp_path / "p.jsonl", rows), invalid="drop")
    assert (len(pairs), dropped) == (2, 2)
    with pytest.raises(UserError, match="missing field 'chosen'"):
        load_pairs(write(tmp_path / "q.jsonl", [{"prompt": "x", "rejected": "y"}]), invalid="drop")
    with pytest.raises(UserError, match="no usable preference pairs"):
        load_pairs(write(tmp_path / "r.jsonl", [{**GOOD, "chosen": ""}]), invalid="drop")


@pytest.mark.parametrize("chat", [True, False])
def test_reply_mask_and_closing_token(nano_tokenizer, chat):
    ids, mask = encode_reply(nano_tokenizer, "Solve: 2 + 2", "Answer: 4", use_chat_template=chat)
    reply = nano_tokenizer.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)
    assert reply == "Answer: 4"
    closing = "<|im_end|>" if chat else "<|endoftext|>"
    assert nano_tokenizer.convert_ids_to_tokens(ids[-1]) == closing and mask[-1] == 1
    assert mask[0] == 0


def test_too_long_pairs_dropped_and_counted(nano_tokenizer):
    pairs = [PreferenceExample("Solve: 2 + 2", "Answer: 4", "Answer: 5"),
             PreferenceExample("Solve: 2 + 2", "Answer: 4 " * 40, "Answer: 5")]
    out, too_long = tokenize_pairs(pairs, nano_tokenizer, max_len=40, use_chat_template=True)
    assert (len(out), too_long) == (1, 1)


def test_collate_layout_and_target_aligned_mask(nano_tokenizer):
    pairs, _ = tokenize_pairs([PreferenceExample("Solve: 2 + 2", "Answer: 4", "Answer: 5 is wrong"),
                               PreferenceExample("Solve: 10 + 3", "Answer: 13", "Answer: 12")],
                              nano_tokenizer, max_len=64, use_chat_template=True)
    b = collate_pairs(pairs, [1, 0], pad_id=nano_tokenizer.pad_token_id)
    assert b.input_ids_BT.shape[0] == 4 and b.num_pairs == 2
    assert b.pair_idx_B.tolist() == [1, 0]
    # Row 0 is pair 1's chosen, row 2 its rejected; the mask column t marks target token t + 1.
    assert b.input_ids_BT[0, : len(pairs[1].chosen_ids)].tolist() == pairs[1].chosen_ids
    assert b.input_ids_BT[2, : len(pairs[1].rejected_ids)].tolist() == pairs[1].rejected_ids
    assert b.mask_BT[0].tolist()[: len(pairs[1].chosen_ids) - 1] == [bool(m) for m in pairs[1].chosen_mask[1:]]
    assert int(b.mask_BT[3].sum()) == sum(pairs[0].rejected_mask)
    assert b.attention_mask_BT.sum(1).tolist() == [len(pairs[1].chosen_ids), len(pairs[0].chosen_ids),
                                                   len(pairs[1].rejected_ids), len(pairs[0].rejected_ids)]


def test_batch_indices_are_deterministic_and_cover_each_epoch():
    steps = [batch_indices(10, 4, seed=3, step=s) for s in range(5)]
    assert steps == [batch_indices(10, 4, seed=3, step=s) for s in range(5)]
    flat = [i for s in steps for i in s]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert steps != [batch_indices(10, 4, seed=4, step=s) for s in range(5)]


def test_embedded_pairs_have_gold_answers(arith_data_dir):
    from posttrain.verifiers import VERIFIERS

    rows = [json.loads(line) for line in (arith_data_dir / "pairs_eval.jsonl").read_text().splitlines()]
    assert rows
    for r in rows[:20]:
        assert VERIFIERS["arithmetic"](r["chosen"], r).reward == 1.0
        assert VERIFIERS["arithmetic"](r["rejected"], r).reward == 0.0
