"""Loading records from JSONL, Parquet and HF dataset folders, and the schema errors."""

from __future__ import annotations

import json

import pytest

from posttrain.data.records import (PreferenceExample, PromptExample, SFTExample, load_preference_examples,
                                    load_prompt_examples, load_records, load_sft_examples, parse_sft,
                                    write_jsonl)
from posttrain.errors import UserError

ROWS = [{"prompt": "Solve: 2 × 3", "completion": "Answer: 6", "answer": "6"},
        {"prompt": "Solve: 4 × 5", "completion": "Answer: 20", "answer": "20"}]


def test_jsonl_roundtrip_and_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    path.write_text(path.read_text(encoding="utf-8") + "\n\n", encoding="utf-8")
    assert load_records(path) == ROWS
    assert "×" in path.read_text(encoding="utf-8")


def test_json_array_file(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(ROWS), encoding="utf-8")
    assert load_records(tmp_path / "d.json") == ROWS


@pytest.mark.parametrize("content, expected", [
    (json.dumps(ROWS[0]) + "\n\n" + '{"prompt": "x", \n',
     ":3: invalid JSON (Expecting property name enclosed in double quotes at column 17)"),
    (json.dumps(ROWS[0]) + "\n[1, 2]\n", ":2: expected a JSON object, got an array"),
    ("", ": no records (the file is empty)"),
    (None, ": no such file or folder"),
])
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_bad_jsonl_is_file_line_what(tmp_path, content, expected, suffix):
    p = tmp_path / f"data{suffix}"
    if content is not None:
        p.write_text(content, encoding="utf-8")
    for load in (load_records, load_sft_examples, load_prompt_examples, load_preference_examples):
        with pytest.raises(UserError) as e:
            load(p)
        assert str(e.value) == f"{p}{expected}"


def test_json_array_errors_and_other_empty_sources(tmp_path):
    p = tmp_path / "d.json"
    p.write_text('[{"prompt": "x"}, 3]', encoding="utf-8")
    with pytest.raises(UserError, match=r"d\.json\[1\]: expected a JSON object, got int"):
        load_records(p)
    p.write_text(" \n []", encoding="utf-8")
    with pytest.raises(UserError, match=r"^.*d\.json: no records$"):
        load_records(p)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS).slice(0, 0), tmp_path / "e.parquet")
    with pytest.raises(UserError, match=r"e\.parquet: no records$"):
        load_records(tmp_path / "e.parquet")


def test_missing_field_names_file_line_and_field(tmp_path):
    p = write_jsonl(tmp_path / "data.jsonl", [ROWS[0]] * 16 + [{"prompt": "only a prompt"}])
    with pytest.raises(UserError) as e:
        load_sft_examples(p)
    assert str(e.value) == (f"{p}:17: missing field 'completion' "
                            "(an SFT record needs prompt+completion or messages)")
    with pytest.raises(UserError, match=r":1: missing field 'rejected'"):
        load_preference_examples(write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "p", "chosen": "c"}]))
    with pytest.raises(UserError, match=r"x:9: field 'messages' has no assistant turn"):
        parse_sft({"messages": [{"role": "user", "content": "hi"}]}, "x:9")
    with pytest.raises(UserError, match=r"x:9: field 'messages' has no assistant turn"):
        parse_sft({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "weight": 0}]},
                  "x:9")
    for bad in ({"role": "assistant", "content": "a", "weight": 0.5}, {"role": "assistant", "content": "a", "weight": 1.0},
                {"role": "user", "content": "a", "weight": 1}):
        with pytest.raises(UserError, match=r"x:4: messages\[0\]\.weight must be 0 or 1, on an assistant message"):
            parse_sft({"messages": [bad, {"role": "assistant", "content": "b"}]}, "x:4")
    with pytest.raises(UserError, match=r"x:2: field 'completion' must be a string"):
        parse_sft({"prompt": "p", "completion": 5}, "x:2")


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(UserError, match="nope.jsonl: no such file"):
        load_records(tmp_path / "nope.jsonl")
    (tmp_path / "d.csvx").write_text("a", encoding="utf-8")
    with pytest.raises(UserError, match="unknown data format"):
        load_records(tmp_path / "d.csvx")


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    assert load_records(tmp_path / "d.parquet") == ROWS


def test_hf_dataset_folders(tmp_path):
    import datasets

    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    assert load_records(tmp_path / "saved") == ROWS
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "dd"))
    assert load_records(tmp_path / "dd") == ROWS
    folder = tmp_path / "files"
    write_jsonl(folder / "train.jsonl", ROWS)
    assert load_records(folder) == ROWS


def test_typed_examples(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", ROWS + [{"messages": [{"role": "user", "content": "hi"},
                                                               {"role": "assistant", "content": "yo"}]}])
    exs = load_sft_examples(p)
    assert exs[0] == SFTExample(prompt="Solve: 2 × 3", completion="Answer: 6")
    assert exs[2].messages[1]["content"] == "yo" and exs[2].prompt is None
    prompts = load_prompt_examples(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "answer": 7, "tests": ["t"]}]))
    assert prompts == [PromptExample(prompt="q", answer="7", extra={"tests": ["t"]})]
    assert prompts[0].as_dict() == {"tests": ["t"], "prompt": "q", "answer": "7"}
    pairs = load_preference_examples(write_jsonl(tmp_path / "q.jsonl", [{"prompt": "p", "chosen": "a",
                                                                          "rejected": "b", "answer": "1"}]))
    assert pairs == [PreferenceExample(prompt="p", chosen="a", rejected="b")]
