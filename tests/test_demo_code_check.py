"""posttrain.demo.code_check: the fixed draw of training problems and the paired start-to-end change."""

import json

import pytest

from posttrain.demo.code_check import start_to_end, train_sample
from posttrain.eval.results import SampleRecord, summarize, write_eval_json


def test_the_draw_is_fixed_by_the_seed_and_spans_the_file(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(100)))
    a = train_sample(train, tmp_path / "a", 10, seed=0).read_text().splitlines()
    b = train_sample(train, tmp_path / "b", 10, seed=0).read_text().splitlines()
    c = train_sample(train, tmp_path / "c", 10, seed=1).read_text().splitlines()
    assert a == b and a != c and len(set(a)) == 10
    assert a != train.read_text().splitlines()[:10]  # not the first templates only


def _written(folder, passes: dict[str, int], n: int = 8):
    samples = [SampleRecord(problem_id=pid, sample_index=i, completion="",
                            outcome="PASS" if i < passed else "MODEL_FAIL")
               for pid, passed in passes.items() for i in range(n)]
    folder.mkdir(parents=True)
    write_eval_json(folder / "eval.json", [summarize(samples, benchmark="train", profile="t1", model="m", ks=[1])])


def test_the_change_is_paired_by_problem_from_written_evaluations(tmp_path):
    # Written evaluations are reused (no model is run: the model paths do not exist), and the change
    # pairs each problem with itself: p2 is judged only at the end and must not count.
    _written(tmp_path / "start-direct", {"p0": 2, "p1": 4})
    _written(tmp_path / "end-direct", {"p0": 4, "p1": 4, "p2": 8})
    c = start_to_end("no-such-start", "no-such-end", tmp_path / "unused.jsonl", tmp_path, "direct", 96, seed=0)
    assert c.problems == 2 and c.unpaired == 1
    assert c.change == pytest.approx(100 * (4 / 8 - 2 / 8) / 2)
    assert c.before == pytest.approx(100 * 6 / 16)
