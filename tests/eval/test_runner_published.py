"""`posttrain eval` on datasets as published: kodcode, mbpp, evalplus (base and plus from one
file) and livecodebench (difficulty, contest_date window), judged in the sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.data.records import load_tasks
from posttrain.eval.results import read_samples
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


class CountingOracle(OracleEngine):
    def __init__(self, tokenizer, answers):
        super().__init__(tokenizer, answers)
        self.prompts = 0

    def generate(self, prompts, n, sampling):
        self.prompts += len(prompts)
        return super().generate(prompts, n, sampling)


def test_base_and_plus_are_judged_on_one_set_of_samples(tmp_path, tokenizer, capsys):
    """As evalplus does: HumanEval+ reuses HumanEval's samples of the same prompt (also from a
    finished samples file on a later run), judged against its own inputs; another profile does not."""
    plus = [t for _, t in load_tasks(str(FIXTURES / "evalplus.jsonl"))]
    gcd = "```python\ndef greatest_common_divisor(a, b):\n    return max(d for d in range(1, min(a, b) + 1) if a % d == 0 and b % d == 0)\n```"
    answers = {t["prompt"]: gcd if t["entry_point"] == "greatest_common_divisor" else t["completion"] for t in plus}
    base = f'{{"name": "humaneval", "kind": "evalplus", "variant": "base", "path": "{FIXTURES}/evalplus.jsonl"}}'
    plus_ = f'{{"name": "humaneval_plus", "kind": "evalplus", "path": "{FIXTURES}/evalplus.jsonl"}}'
    engine = CountingOracle(tokenizer, answers)
    results = run_eval(config(tmp_path / "both", f"benchmarks=[{base}, {plus_}]"), engine=engine, tokenizer=tokenizer,
                       show_progress=False)
    assert engine.prompts == 6 and [r.outcomes["PASS"] for r in results] == [6, 5]
    assert "humaneval_plus · greedy: 6 of 6 problems judged on the samples already drawn" in capsys.readouterr().out
    texts = [[s.completion for s in read_samples(tmp_path / "both" / "samples" / f"{name}.greedy.jsonl")]
             for name in ("humaneval", "humaneval_plus")]
    assert texts[0] == texts[1]

    engine = CountingOracle(tokenizer, answers)
    run_eval(config(tmp_path / "later", f"benchmarks=[{base}]"), engine=engine, tokenizer=tokenizer, show_progress=False)
    results = run_eval(config(tmp_path / "later", f"benchmarks=[{base}, {plus_}]"), engine=engine,
                       tokenizer=tokenizer, show_progress=False)
    assert engine.prompts == 6 and [r.outcomes["PASS"] for r in results] == [6, 5]

    engine = CountingOracle(tokenizer, answers)
    profiles = 'profiles=[{"name": "short", "max_new_tokens": 8}, {"name": "long", "max_new_tokens": 9}]'
    run_eval(config(tmp_path / "profiles", f"benchmarks=[{base}, {plus_}]", profiles), engine=engine,
             tokenizer=tokenizer, show_progress=False)
    assert engine.prompts == 12  # each profile draws its own; plus shares base's within each


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
