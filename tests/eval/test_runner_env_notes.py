"""`posttrain eval` on SWE tasks split within one project (``split_by: file``) says so: one line
printed and the note in that benchmark's result in eval.json; tasks split by project get none."""

import json

from posttrain.config import load_config
from posttrain.eval import runner
from posttrain.eval.results import SampleRecord, read_eval_json
from posttrain.eval.runner import BenchmarkConfig, EvalConfig, env_notes, load_problems


def swe_record(i: int, split_by: str) -> dict:
    return {"instance_id": f"p__m.py:f:operator:{i}", "repo": "p", "base_commit": "0" * 40, "patch": "x",
            "test_patch": "", "FAIL_TO_PASS": ["tests/test_m.py::test_f"], "PASS_TO_PASS": [],
            "problem_statement": f"test {i} fails", "repo_path": "/nowhere", "split_by": split_by}


def write_tasks(path, split_by: str) -> str:
    path.write_text("".join(json.dumps(swe_record(i, split_by)) + "\n" for i in range(2)))
    return str(path)


def swe_bench(path: str) -> BenchmarkConfig:
    return load_config(BenchmarkConfig, None, ["kind=env", "env.name=swe", f"path={path}", "name=swe"])


def test_only_tasks_split_within_one_project_get_the_note(tmp_path):
    by_file = swe_bench(write_tasks(tmp_path / "file.jsonl", "file"))
    by_project = swe_bench(write_tasks(tmp_path / "project.jsonl", "project"))
    (note,) = env_notes(by_file, load_problems(by_file, 0))
    assert "within one project" in note and "split_by: file" in note
    assert env_notes(by_project, load_problems(by_project, 0)) == []


def test_eval_prints_the_note_and_writes_it_into_the_result(tmp_path, monkeypatch, capsys):
    def episodes(engine, tokenizer, env_cfg, problems, profile, cfg):
        return [SampleRecord(problem_id=p["id"], sample_index=i, completion="", outcome="MODEL_FAIL",
                             reason="wrong_answer", turns=1) for p in problems for i in range(profile.n)]

    monkeypatch.setattr(runner, "run_env_chunk", episodes)
    monkeypatch.setattr(runner, "_judge", lambda bench: bench.env)
    by_file, by_project = write_tasks(tmp_path / "file.jsonl", "file"), write_tasks(tmp_path / "p.jsonl", "project")
    benches = (f'benchmarks=[{{"name": "within", "kind": "env", "env": {{"name": "swe"}}, "path": "{by_file}"}}, '
               f'{{"name": "across", "kind": "env", "env": {{"name": "swe"}}, "path": "{by_project}"}}]')
    cfg = load_config(EvalConfig, None, ["model=m", f"out_dir={tmp_path / 'out'}", benches])
    runner.run_eval(cfg, engine=object(), tokenizer=object(), show_progress=False)
    printed = [line for line in capsys.readouterr().out.splitlines() if "within one project" in line]
    assert len(printed) == 1 and printed[0].startswith("within: ")
    notes = {r.benchmark: r.notes for r in read_eval_json(tmp_path / "out" / "eval.json")}
    assert notes["across"] == [] and len(notes["within"]) == 1 and "split_by: file" in notes["within"][0]
