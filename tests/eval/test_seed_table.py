"""The seed's table in `posttrain report`: its numbers are the eval files' numbers, its changes
paired differences over the same problems, in the HTML page and as Markdown."""

from __future__ import annotations

import random

import pytest

from posttrain.cli import main
from posttrain.eval.report import find_runs, write_report_files
from posttrain.eval.results import SampleRecord, read_eval_json, summarize, write_eval_json
from posttrain.eval.seed_table import SEED_ROWS, cell, pooled_cell, seed_table, to_markdown


def _result(bench: str, passed: dict[str, int], n: int, label: str, profile: str, step: int):
    samples = [SampleRecord(problem_id=pid, sample_index=i, completion="x", outcome="PASS" if i < c else "MODEL_FAIL")
               for pid, c in passed.items() for i in range(n)]
    return summarize(samples, benchmark=bench, profile=profile, model="m", label=label, step=step, ks=[1])


def _write_run(root, name: str, profile: str, seed: int, drop_one: str = ""):
    """A run folder as the docs lay it out: evals/before/eval.json (the SFT start) and evals/after/eval.json."""
    rng = random.Random(seed)
    run = root / name
    (run / "evals").mkdir(parents=True)
    sizes = {bench: rng.randint(8, 20) for _, bench in SEED_ROWS}
    for label, step in (("before", 0), ("after", 125)):
        results = []
        for _, bench in SEED_ROWS:
            problems = {f"{bench}/{i}": rng.randint(0, 1) for i in range(sizes[bench])}
            if label == "after" and bench == drop_one:
                problems.pop(next(iter(problems)))
            results.append(_result(bench, problems, 1, label, profile, step))
        write_eval_json(run / "evals" / label / "eval.json", results)
    return run


@pytest.fixture
def runs(tmp_path):
    _write_run(tmp_path, "seed-direct", "greedy", seed=1)
    _write_run(tmp_path, "seed-reasoning", "t0.6", seed=2, drop_one="lcb_hard")
    return [tmp_path / "seed-direct", tmp_path / "seed-reasoning"]


def _parse(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_the_tables_numbers_are_the_eval_files(runs):
    table = seed_table([(r.name, r.evals) for r in find_runs(runs)])
    assert table.columns == ["seed-direct · greedy", "seed-reasoning · t0.6"]
    rows = _parse(to_markdown(table))
    assert [r[0] for r in rows] == [title for title, _ in SEED_ROWS]
    for col, run in enumerate(runs):
        files = {label: {r.benchmark: r for r in read_eval_json(run / "evals" / label / "eval.json")}
                 for label in ("before", "after")}
        for (title, bench), row in zip(SEED_ROWS, rows):
            start, after, change = row[1 + 3 * col: 4 + 3 * col]
            b, a = files["before"][bench].pass_at_k[0].mean, files["after"][bench].pass_at_k[0].mean
            assert (float(start), float(after)) == (round(100 * b, 1), round(100 * a, 1)), title
            delta = float(change.split(" [")[0])
            if "unpaired" in change:  # the change is over the problems both judged
                assert (run.name, bench) == ("seed-reasoning", "lcb_hard") and "(1 unpaired)" in change
            else:  # same problems: the paired mean change is the difference of the two pass@1 values
                assert delta == pytest.approx(round(100 * (a - b), 1), abs=0.051), title


def test_a_change_over_shared_problems_by_hand():
    before = _result("mbpp", {"p0": 0, "p1": 0, "p2": 1, "p3": 1}, 1, "before", "greedy", 0)
    after = _result("mbpp", {"p0": 1, "p1": 0, "p2": 1, "p3": 1, "p4": 1}, 1, "after", "greedy", 9)
    c = cell(before, after)
    # start 2/4, after 4/5; the change pairs p0..p3 only: (1 - 0) / 4 = +25 pp
    assert (c.before, c.after, c.change, c.problems, c.unpaired) == (50.0, 80.0, 25.0, 4, 1)
    assert 0.0 <= c.low < 25.0 < c.high <= 75.0


def test_seeds_pooled_by_problem_by_hand():
    # two seeds from one start that fails p0 and p1: seed A's end passes p0, seed B's passes p1. Each
    # seed alone: +50 with an interval from 0 to 100. Pooled, each problem's change averaged over the
    # seeds is +0.5 on both problems, so every resample's mean is +50: the interval is [50, 50]. A
    # pool that treated the four (seed, problem) changes as independent draws would keep the 0..100 spread.
    start = _result("mbpp", {"p0": 0, "p1": 0}, 1, "before", "greedy", 0)
    a = _result("mbpp", {"p0": 1, "p1": 0}, 1, "after", "greedy", 9)
    b = _result("mbpp", {"p0": 0, "p1": 1}, 1, "after", "greedy", 9)
    assert (cell(start, a).low, cell(start, a).high) == (0.0, 100.0)
    pooled = pooled_cell([(start, a), (start, b)])
    assert (pooled.before, pooled.after, pooled.change, pooled.low, pooled.high) == (0.0, 50.0, 50.0, 50.0, 50.0)
    # a problem only one seed judged is left out of the pool and counted as unpaired
    c = _result("mbpp", {"p0": 0, "p1": 1, "p2": 1}, 1, "after", "greedy", 9)
    start3 = _result("mbpp", {"p0": 0, "p1": 0, "p2": 0}, 1, "before", "greedy", 0)
    pooled = pooled_cell([(start, a), (start3, c)])
    assert (pooled.change, pooled.problems, pooled.unpaired) == (50.0, 2, 1)


def test_runs_without_the_seeds_benchmarks_have_no_table(tmp_path):
    run = tmp_path / "other"
    write_eval_json(run / "evals" / "eval.json", [_result("arithmetic", {"a": 1}, 1, "before", "greedy", 0),
                                                  _result("arithmetic", {"a": 1}, 1, "after", "greedy", 5)])
    html_page, table = write_report_files([run], tmp_path / "r.html")
    assert table is None and "starting checkpoint" not in html_page.read_text()


def test_html_and_markdown_from_the_cli(runs, tmp_path, capsys):
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "seed.html")]) == 0
    printed = capsys.readouterr().out
    markdown = (tmp_path / "seed.md").read_text()
    assert f"table: {tmp_path / 'seed.md'}" in printed and markdown in printed
    page = (tmp_path / "seed.html").read_text()
    assert "Code benchmarks against the starting checkpoint" in page
    for row in _parse(markdown):  # every figure of the Markdown is in the page's table
        assert all(f"<td>{c}</td>" in page for c in row)


EVAL_CONFIGS = {"direct": ("examples/seed_eval_direct.yaml", "greedy", 0.0, False, 2048),
                "reasoning": ("examples/seed_eval_reasoning.yaml", "t0.6", 0.6, True, 8192)}


def _eval_config(name: str, tmp_path, overrides=(), max_new_tokens: int = 0):
    """The recipe's eval config with the benchmark files pointed at the published-format fixtures
    (and, given ``max_new_tokens``, its profile's length)."""
    from pathlib import Path

    import yaml

    from posttrain.config import load_config
    from posttrain.eval.runner import EvalConfig

    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / EVAL_CONFIGS[name][0]).read_text())
    fixtures = root / "tests" / "data" / "formats"
    for bench in data["benchmarks"]:
        bench["path"] = str(fixtures / ("livecodebench.jsonl" if bench["kind"] == "livecodebench" else "evalplus.jsonl"))
    if max_new_tokens:
        data["profiles"][0]["max_new_tokens"] = max_new_tokens
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(EvalConfig, str(path), list(overrides))


@pytest.mark.parametrize("name", list(EVAL_CONFIGS))
def test_the_eval_recipes_name_the_tables_rows(name, tmp_path):
    _, profile, temperature, thinking, max_new = EVAL_CONFIGS[name]
    cfg = _eval_config(name, tmp_path)
    assert [b.name for b in cfg.benchmarks] == [bench for _, bench in SEED_ROWS]
    assert [(b.kind, b.variant) for b in cfg.benchmarks[:4]] == [("evalplus", "base"), ("evalplus", "plus")] * 2
    assert [b.difficulty for b in cfg.benchmarks[4:]] == ["easy", "medium", "hard"]
    [p] = cfg.profiles
    assert (p.name, p.temperature, p.n, p.max_new_tokens, cfg.thinking, cfg.ks) == \
        (profile, temperature, 1, max_new, thinking, [1])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EVAL_CONFIGS))
def test_eval_then_report_gives_the_table_of_the_eval_files(name, nano_model_dir, tmp_path):
    """`posttrain eval` of the recipe (benchmark files and lengths overridden) twice, labelled before
    and after, then `posttrain report`: the table's figures are the eval files'."""
    from posttrain.eval.runner import run_eval
    from posttrain.sandbox.worker import probe

    if not (probe()["bwrap"] and probe()["root"]):
        pytest.skip("no sandbox here")
    run = tmp_path / "run"
    for label in ("before", "after"):
        cfg = _eval_config(name, tmp_path, [f"model={nano_model_dir}", f"label={label}", "dtype=float32",
                                            f"out_dir={run / 'evals' / label}"], max_new_tokens=24)
        run_eval(cfg, show_progress=False)
    _, table = write_report_files([run], tmp_path / "report.html")
    rows = _parse(table.read_text())
    files = {label: {r.benchmark: r for r in read_eval_json(run / "evals" / label / "eval.json")}
             for label in ("before", "after")}
    for (title, bench), row in zip(SEED_ROWS, rows, strict=True):
        b, a = (files[label][bench] for label in ("before", "after"))
        assert row[:3] == [title, f"{100 * b.pass_at_k[0].mean:.1f}", f"{100 * a.pass_at_k[0].mean:.1f}"]
        assert b.num_problems == {"lcb_easy": 4, "lcb_medium": 2, "lcb_hard": 1}.get(bench, 6)
