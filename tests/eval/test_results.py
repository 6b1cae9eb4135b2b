"""eval.json and per-sample JSONL: summaries by hand, round trips, torn lines, malformed files."""

import json

import pytest

from posttrain.errors import UserError
from posttrain.eval.results import (SampleRecord, append_samples, read_eval_json, read_samples, summarize,
                                    write_eval_json)


def sample(pid, i, outcome, reason="", tokens=10):
    return SampleRecord(problem_id=pid, sample_index=i, completion=f"c{i}", outcome=outcome, reason=reason,
                        reward=float(outcome == "PASS"), completion_tokens=tokens)


def four_by_two():
    # p0: 1 of 4 passed; p1: 4 of 4; p2: 0 of 4 (one infra failure, one format failure).
    out = [sample("p0", 0, "PASS")] + [sample("p0", i, "MODEL_FAIL", "wrong_answer") for i in (1, 2, 3)]
    out += [sample("p1", i, "PASS", tokens=20) for i in range(4)]
    out += [sample("p2", 0, "INFRA_FAIL", "worker_died"), sample("p2", 1, "MODEL_FAIL", "format")]
    out += [sample("p2", i, "MODEL_FAIL", "wrong_answer") for i in (2, 3)]
    return out


def test_summarize_by_hand():
    result = summarize(four_by_two(), benchmark="arith", profile="sampled", model="m", label="after", step=7)
    assert (result.n, result.num_problems) == (4, 3)
    by_k = {row.k: row.mean for row in result.pass_at_k}
    assert list(by_k) == [1, 2, 4]
    assert by_k[1] == pytest.approx((0.25 + 1 + 0) / 3)
    assert by_k[2] == pytest.approx((0.5 + 1 + 0) / 3)
    assert by_k[4] == pytest.approx(2 / 3)
    assert result.outcomes == {"PASS": 5, "MODEL_FAIL": 6, "TASK_FAIL": 0, "INFRA_FAIL": 1}
    assert result.fail_reasons == {"format": 1, "wrong_answer": 5}
    assert [(p.problem_id, p.n, p.passed) for p in result.per_problem] == [("p0", 4, 1), ("p1", 4, 4), ("p2", 4, 0)]
    assert result.mean_completion_tokens == pytest.approx((8 * 10 + 4 * 20) / 12)
    assert (result.solve_all_frac, result.solve_none_frac) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
    with pytest.raises(ValueError):
        summarize(four_by_two(), benchmark="a", profile="p", model="m", ks=[8])


def test_eval_json_round_trip(tmp_path):
    a = summarize(four_by_two(), benchmark="arith", profile="sampled", model="m", sampling={"temperature": 1.0})
    b = summarize(four_by_two()[:4], benchmark="math", profile="greedy", model="m", ks=[1])
    write_eval_json(tmp_path / "evals" / "eval.json", [a, b])
    assert read_eval_json(tmp_path / "evals" / "eval.json") == [a, b]


def test_eval_json_errors_name_file_and_key(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text("{")
    with pytest.raises(UserError, match="eval.json:1: malformed JSON"):
        read_eval_json(path)
    path.write_text(json.dumps({"results": []}))
    with pytest.raises(UserError, match="key 'format'"):
        read_eval_json(path)
    good = summarize(four_by_two(), benchmark="a", profile="p", model="m")
    write_eval_json(path, [good])
    payload = json.loads(path.read_text())
    del payload["results"][0]["n"]
    path.write_text(json.dumps(payload))
    with pytest.raises(UserError, match=r"results\[0\]: missing key 'n'"):
        read_eval_json(path)
    payload["results"][0]["n"] = 4
    payload["results"][0]["typo"] = 1
    path.write_text(json.dumps(payload))
    with pytest.raises(UserError, match=r"results\[0\]: unknown key 'typo'"):
        read_eval_json(path)


def test_samples_append_and_torn_last_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    assert read_samples(path) == []
    records = four_by_two()
    append_samples(path, records[:3])
    append_samples(path, records[3:5])
    with open(path, "a") as f:
        f.write('{"problem_id": "p9", "sampl')  # interrupted mid-write
    assert read_samples(path) == records[:5]
    assert read_samples(path, repair=True) == records[:5]
    append_samples(path, records[5:6])
    assert read_samples(path) == records[:6]


def test_samples_malformed_middle_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    append_samples(path, four_by_two()[:1])
    with open(path, "a") as f:
        f.write("garbage\n")
    append_samples(path, four_by_two()[1:2])
    with pytest.raises(UserError, match="samples.jsonl:2: not a sample record"):
        read_samples(path)
