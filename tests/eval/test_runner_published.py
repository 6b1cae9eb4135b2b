"""`posttrain eval` on datasets as published: kodcode, mbpp, evalplus (base and plus from one
file) and livecodebench (difficulty, contest_date window), judged in the sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.data.records import load_tasks
from posttrain.eval.runner import BenchmarkConfig, load_problems, run_eval
from posttrain.sandbox.worker import probe
from tests.data.test_evalplus import write_slice
from tests.eval.test_runner_code import OracleEngine, config

pytestmark = pytest.mark.skipif(not (probe()["bwrap"] and probe()["root"]), reason="no sandbox here")
FIXTURES = Path(__file__).parents[1] / "data" / "formats"


@pytest.fixture(scope="module")
def tokenizer(nano_model_dir):
    from posttrain.models.hf import load_tokenizer

    return load_tokenizer(nano_model_dir)


def test_kodcode_and_evalplus_base_and_plus(tmp_path, tokenizer):
    kod = [t for _, t in load_tasks(str(FIXTURES / "kodcode.jsonl"))]
    plus = [t for _, t in load_tasks(str(FIXTURES / "evalplus.jsonl"))]
    answers = {t["prompt"]: (t["completion"] if i % 2 == 0 else "```python\ndef nothing():\n    pass\n```")
               for i, t in enumerate(kod)}
    gcd = "```python\ndef greatest_common_divisor(a, b):\n    return max(d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0)\n```"
    answers.update({t["prompt"]: gcd if t["entry_point"] == "greatest_common_divisor" else t["completion"] for t in plus})
    benches = (f'benchmarks=[{{"kind": "kodcode", "path": "{FIXTURES}/kodcode.jsonl"}}, '
               f'{{"name": "humaneval", "kind": "evalplus", "variant": "base", "path": "{FIXTURES}/evalplus.jsonl"}}, '
               f'{{"name": "humaneval_plus", "kind": "evalplus", "path": "{FIXTURES}/evalplus.jsonl"}}]')
    results = run_eval(config(tmp_path, benches), engine=OracleEngine(tokenizer, answers), tokenizer=tokenizer,
                       show_progress=False)
    assert [(r.benchmark, r.outcomes["PASS"], r.num_problems) for r in results] == [
        ("kodcode", 4, 7), ("humaneval", 6, 6), ("humaneval_plus", 5, 6)]


def test_livecodebench_difficulty_and_window():
    path = str(FIXTURES / "livecodebench.jsonl")
    easy = load_problems(BenchmarkConfig(kind="livecodebench", path=path, difficulty="easy"), seed=0)
    assert [p["id"] for p in easy] == ["abc301_a", "3000", "abc303_a", "abc304_a"]
    window = load_problems(BenchmarkConfig(kind="livecodebench", path=path, since="2024-01-01"), seed=0)
    assert [p["id"] for p in window] == ["1850_C", "3000", "3001"]


def test_mbpp_problems_carry_their_tests():
    (first, *_) = load_problems(BenchmarkConfig(kind="mbpp", path=str(FIXTURES / "mbpp_sanitized.jsonl")), seed=0)
    assert first["id"] == "611" and first["entry_point"] == "volume_sphere" and "import math" in first["tests"]


def test_mbpp_plus_release_file_as_published(tmp_path, tokenizer):
    """The release file gzipped, ``plus_input: {}`` (Mbpp/793), tuple inputs (Mbpp/106) and the
    "is not None" oracle (Mbpp/737): each canonical answer passes, as under evalplus."""
    path = write_slice(tmp_path / "MbppPlus.jsonl.gz", "MbppPlus", ["Mbpp/106", "Mbpp/737", "Mbpp/793"])
    answers = {t["prompt"]: t["completion"] for _, t in load_tasks(path)}
    benches = f'benchmarks=[{{"name": "mbpp_plus", "kind": "evalplus", "path": "{path}"}}]'
    results = run_eval(config(tmp_path, benches), engine=OracleEngine(tokenizer, answers), tokenizer=tokenizer,
                       show_progress=False)
    assert [(r.benchmark, r.outcomes["PASS"], r.num_problems) for r in results] == [("mbpp_plus", 3, 3)]
