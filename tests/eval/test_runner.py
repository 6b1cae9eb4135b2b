"""posttrain eval on the nano model: results written, resume skips finished problems, bad input named."""

import argparse
import json

import pytest

from posttrain.config import load_config
from posttrain.errors import UserError
from posttrain.eval import eval_cli
from posttrain.eval.report import find_runs
from posttrain.eval.results import read_eval_json, read_samples
from posttrain.eval.runner import EvalConfig, _load_engine, load_problems, resolve_model, run_eval


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    from posttrain.models.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("nano") / "model", size="nano")


def config(model, out, *overrides):
    return load_config(EvalConfig, None, [f"model={model}", f"out_dir={out}", "chunk_problems=3", *overrides])


PROFILES = ('profiles=[{"name": "greedy", "max_new_tokens": 6}, '
            '{"name": "sampled", "temperature": 1.0, "n": 4, "max_new_tokens": 6}]')


class CountingEngine:
    """Wraps an engine and counts the prompts it is asked to generate for."""

    def __init__(self, engine):
        self.engine, self.prompts = engine, 0

    def generate(self, prompts, n, sampling):
        self.prompts += len(prompts)
        return self.engine.generate(prompts, n, sampling)


def test_arithmetic_eval_writes_results(nano, tmp_path):
    cfg = config(nano, tmp_path / "out", 'benchmarks=[{"kind": "arithmetic", "num_problems": 7}]', PROFILES,
                 "label=before")
    results = run_eval(cfg, show_progress=False)
    assert [(r.benchmark, r.profile, r.n, r.num_problems) for r in results] == [
        ("arithmetic", "greedy", 1, 7), ("arithmetic", "sampled", 4, 7)]
    assert [row.k for row in results[1].pass_at_k] == [1, 2, 4]
    assert read_eval_json(tmp_path / "out" / "eval.json") == results
    samples = read_samples(tmp_path / "out" / "samples" / "arithmetic.sampled.jsonl")
    assert len(samples) == 28 and all(1 <= s.completion_tokens <= 6 for s in samples)
    assert sum(results[1].outcomes.values()) == 28
    assert results[0].label == "before" and results[1].sampling["temperature"] == 1.0
    # The output folder is a run the report can read.
    assert len(find_runs([tmp_path / "out"])[0].evals) == 2


def test_resume_skips_finished_problems(nano, tmp_path):
    engine, tokenizer = _load_engine(str(nano), config(nano, tmp_path))
    cfg = config(nano, tmp_path / "out", 'benchmarks=[{"kind": "arithmetic", "num_problems": 7}]',
                 'profiles=[{"name": "sampled", "temperature": 1.0, "n": 2, "max_new_tokens": 4}]')
    first = CountingEngine(engine)
    full = run_eval(cfg, engine=first, tokenizer=tokenizer, show_progress=False)[0]
    assert first.prompts == 7
    # Simulate an interruption after the first chunk (3 problems) and a torn write.
    path = tmp_path / "out" / "samples" / "arithmetic.sampled.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:6]) + lines[6][:20])
    second = CountingEngine(engine)
    resumed = run_eval(cfg, engine=second, tokenizer=tokenizer, show_progress=False)[0]
    assert second.prompts == 4
    assert resumed.num_problems == 7 and len(read_samples(path)) == 14
    assert [p.problem_id for p in resumed.per_problem] == [p.problem_id for p in full.per_problem]
    third = CountingEngine(engine)
    run_eval(cfg, engine=third, tokenizer=tokenizer, show_progress=False)
    assert third.prompts == 0


def test_math_jsonl_benchmark_via_cli(nano, tmp_path, capsys):
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(3)))
    yaml_path = tmp_path / "eval.yaml"
    yaml_path.write_text(f"model: {nano}\nout_dir: {tmp_path / 'out'}\nbenchmarks:\n"
                         f"  - {{kind: math, name: toy, path: {data}}}\n"
                         "profiles:\n  - {name: greedy, max_new_tokens: 4}\n")
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    assert eval_cli.run(parser.parse_args([str(yaml_path), "--no-progress"])) == 0
    assert "toy greedy: n=1 problems=3 pass@1=" in capsys.readouterr().out
    result = read_eval_json(tmp_path / "out" / "eval.json")[0]
    assert [p.problem_id for p in result.per_problem] == ["q0", "q1", "q2"]


def test_bad_input(nano, tmp_path):
    with pytest.raises(UserError, match="model=.*does not exist"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(UserError, match="profiles\\[0\\].n"):
        config(nano, tmp_path, 'profiles=[{"name": "greedy", "n": 4}]')
    with pytest.raises(UserError, match="out_dir"):
        load_config(EvalConfig, None, [f"model={nano}"])
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "no answer"}) + "\n")
    cfg = config(nano, tmp_path, f'benchmarks=[{{"kind": "math", "path": "{data}"}}]')
    with pytest.raises(UserError, match=r"bad.jsonl:1: a math problem needs 'prompt' and 'answer'"):
        load_problems(cfg.benchmarks[0], 0)


def test_run_directory_resolves_to_newest_checkpoint(nano, tmp_path):
    import shutil

    for step in (2, 10):
        shutil.copytree(nano, tmp_path / "run" / "checkpoints" / f"step-{step}")
    path, step = resolve_model(str(tmp_path / "run"))
    assert step == 10 and path.endswith("step-10")


class SlowEngine(CountingEngine):
    """Generation that takes ``seconds`` (a big chunk on a CPU); records what was printed meanwhile."""

    def __init__(self, engine, seconds, capsys):
        super().__init__(engine)
        self.seconds, self.capsys, self.printed_while_generating = seconds, capsys, []

    def generate(self, prompts, n, sampling):
        import time

        self.capsys.readouterr()  # what came before this call is not this call's
        time.sleep(self.seconds)
        self.printed_while_generating.append(self.capsys.readouterr().out)
        return super().generate(prompts, n, sampling)


def test_off_a_terminal_progress_lines_come_while_a_chunk_generates(nano, tmp_path, capsys, monkeypatch):
    """One generate call longer than the progress interval (a whole benchmark in one chunk) still
    prints lines at that interval, not only when the chunk is done."""
    monkeypatch.setenv("POSTTRAIN_PROGRESS_EVERY_S", "0.4")
    engine, tokenizer = _load_engine(str(nano), config(nano, tmp_path))
    slow = SlowEngine(engine, 2.0, capsys)
    cfg = config(nano, tmp_path / "out", 'benchmarks=[{"kind": "arithmetic", "num_problems": 4}]',
                 'profiles=[{"name": "greedy", "max_new_tokens": 4}]', "chunk_problems=4")
    run_eval(cfg, engine=slow, tokenizer=tokenizer, show_progress=True)
    lines = [line for line in slow.printed_while_generating[0].splitlines() if line.startswith("arithmetic")]
    assert len(lines) >= 3, slow.printed_while_generating  # 2 s at 0.4 s: about 5
    assert "working on 4 samples of 4 problems" in lines[-1] and "0/4" in lines[-1]
