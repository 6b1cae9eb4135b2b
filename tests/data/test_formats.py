"""Published code datasets read as published: detection, the task record each loader yields,
LiveCodeBench's private tests decoded without running code, the date window, Parquet and
``datasets`` folders, and bad input named by file and line."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

import pytest

from posttrain.data import formats
from posttrain.data.records import load_prompt_examples, load_sft_examples, load_tasks
from posttrain.errors import UserError

FIXTURES = Path(__file__).parent / "formats"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name, fmt", [("kodcode.jsonl", "kodcode"), ("mbpp.jsonl", "mbpp"),
                                       ("mbpp_sanitized.jsonl", "mbpp"), ("evalplus.jsonl", "evalplus"),
                                       ("livecodebench.jsonl", "livecodebench")])
def test_each_fixture_is_detected_from_its_fields(name, fmt):
    got = [formats.detect(r) for r in rows(name)]
    assert len(got) >= 5 and set(got) == {fmt}


def test_kodcode_record_is_a_pytest_task():
    task = formats.convert(rows("kodcode.jsonl")[0], "k:1")
    assert (task["id"], task["module"], task["entry_points"]) == ("Leetcode_1001_I", "solution", ["two_sum"])
    # KodCode's harness writes each test file as `from solution import *` and then the record's tests
    assert task["tests"] == "from solution import *\n\n" + rows("kodcode.jsonl")[0]["test"]
    assert "function declaration is def two_sum(nums, target):" in task["prompt"]
    assert task["completion"].startswith("```python\ndef two_sum")
    complete = formats.convert(rows("kodcode.jsonl")[4], "k:5")  # style "complete": the question is the signature
    assert "function declaration" not in complete["prompt"]


def test_mbpp_entry_point_and_tests_from_both_releases():
    original = formats.convert(rows("mbpp.jsonl")[3], "m:4")
    assert original["entry_point"] == "circle_area"
    assert original["tests"].startswith("PI = 3.14159") and "def check(candidate):" in original["tests"]
    assert "Your code should pass these tests" in original["prompt"]
    sanitized = formats.convert(rows("mbpp_sanitized.jsonl")[0], "s:1")
    assert sanitized["tests"].startswith("import math") and sanitized["entry_point"] == "volume_sphere"


def test_evalplus_base_and_plus_inputs():
    rec = rows("evalplus.jsonl")[3]
    plus, base = formats.convert(rec, "e:4"), formats.convert(rec, "e:4", variant="base")
    spec = lambda task: json.loads(eval(task["tests"].split("_RAW = ", 1)[1].split("\n", 1)[0]))  # noqa: E731
    assert [len(g) for g in spec(base)["groups"]] == [len(rec["base_input"])]
    assert [len(g) for g in spec(plus)["groups"]] == [len(rec["base_input"]), len(rec["plus_input"])]
    assert (plus["variant"], base["variant"], plus["reference"]) == ("plus", "base", rec["prompt"] + rec["canonical_solution"])
    assert spec(formats.convert(rows("evalplus.jsonl")[5], "e:6"))["oracle"] == "set_eq"  # Mbpp/2


def test_livecodebench_stdin_and_functional_tasks():
    lcb = rows("livecodebench.jsonl")
    stdin = formats.convert(lcb[0], "l:1")
    assert stdin["compare"] == "tokens" and stdin["difficulty"] == "easy"
    assert [c["stdout"] for c in stdin["io"]] == ["3\n", "50\n", "0\n"]  # public, then the decoded private
    func = formats.convert(lcb[3], "l:4")
    assert func["entry_point"] == "__posttrain_entry__" and "'twoSum'" in func["program_suffix"]
    assert "class Solution:" in func["prompt"] and func["contest_date"] == "2024-06-01T00:00:00"


def test_private_tests_never_unpickle_objects(monkeypatch):
    marker = Path("/tmp/posttrain-pwned")
    marker.unlink(missing_ok=True)
    evil, not_str = (formats.convert(r, "l") for r in rows("livecodebench.jsonl")[5:7])
    assert "refused to load" in evil["task_error"] and not marker.exists()
    assert "unpickle to list" in not_str["task_error"]
    monkeypatch.setattr(formats, "MAX_PRIVATE_BYTES", 1 << 16)  # a zlib bomb is cut where it passes the cap
    bomb = base64.b64encode(zlib.compress(pickle.dumps("x" * (1 << 20)))).decode()
    with pytest.raises(ValueError, match="over"):
        formats.decode_private_tests(bomb)


def test_contest_date_window():
    lcb = rows("livecodebench.jsonl")
    kept = [formats.convert(r, "l", since="2024-01-01", until="2025-01-01") for r in lcb]
    assert [t["id"] for t in kept if t] == ["1850_C", "3000"]


def test_parquet_and_datasets_folder_read_the_same(tmp_path):
    import datasets

    recs = rows("kodcode.jsonl")
    datasets.Dataset.from_list(recs).to_parquet(str(tmp_path / "k.parquet"))
    datasets.Dataset.from_list(recs).save_to_disk(str(tmp_path / "k_folder"))
    want = [t["tests"] for _, t in load_tasks(str(FIXTURES / "kodcode.jsonl"))]
    assert [t["tests"] for _, t in load_tasks(str(tmp_path / "k.parquet"))] == want
    assert [t["tests"] for _, t in load_tasks(str(tmp_path / "k_folder"))] == want


def test_rl_and_sft_loaders_read_published_records():
    prompts = load_prompt_examples(str(FIXTURES / "mbpp.jsonl"))
    assert prompts[0].as_dict()["entry_point"] == "shared_elements" and prompts[0].answer is None
    sft = load_sft_examples(str(FIXTURES / "kodcode.jsonl"))
    assert sft[0].completion.startswith("```python") and sft[0].prompt.startswith("Given a list")


@pytest.mark.parametrize("record, fmt, message", [
    ({"foo": 1}, "auto", "f.jsonl:1: cannot tell the dataset format"),
    ({"question": "q", "solution": "s"}, "kodcode", "f.jsonl:1: a kodcode record needs the field 'test'"),
    ({"code": "def f(): pass", "test_list": "assert f()"}, "auto", "field 'test_list' of a mbpp record must be a list"),
    ({"code": "def g(): pass", "test_list": ["assert f() == 1"], "text": "t"}, "auto", "no function of the mbpp"),
    ({"question_content": "q", "public_test_cases": "[", "difficulty": "easy"}, "auto", "not JSON"),
    ({"prompt": "p"}, "nonsense", "unknown dataset format 'nonsense'"),
])
def test_bad_records_name_file_and_line(tmp_path, monkeypatch, record, fmt, message):
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps(record) + "\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        load_tasks("f.jsonl", fmt)
