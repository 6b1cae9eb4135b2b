"""The real-model code demo's reuse of the start's greedy samples across seeds: keyed by the
weights' bytes and the evaluation's settings, and an evaluation fed them generates nothing."""

import dataclasses

from posttrain.demo.code_real import kept_start_eval, reuse_samples
from posttrain.eval.runner import _load_engine, run_eval
from tests.eval.test_runner import CountingEngine, config


def test_the_key_follows_the_weights_bytes_and_the_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    start = tmp_path / "start"
    start.mkdir()
    (start / "model.safetensors").write_bytes(b"\0" * 100)
    (start / "config.json").write_text("{}")
    cfg = config(start, tmp_path / "out", 'benchmarks=[{"kind": "arithmetic", "num_problems": 3}]')
    key = kept_start_eval(cfg, str(start))
    assert key.parent == tmp_path / "cache" / "start-evals" and kept_start_eval(cfg, str(start)) == key
    (start / "config.json").write_text('{"other": 1}')  # not the weights: same key
    assert kept_start_eval(cfg, str(start)) == key
    longer = dataclasses.replace(cfg, profiles=[dataclasses.replace(cfg.profiles[0], max_new_tokens=7)])
    assert kept_start_eval(longer, str(start)) != key
    (start / "model.safetensors").write_bytes(b"\0" * 99 + b"\1")
    assert kept_start_eval(cfg, str(start)) != key


def test_an_evaluation_given_the_kept_samples_generates_nothing_and_gives_the_same_result(tmp_path, capsys):
    from posttrain.models.tiny import build_tiny

    nano = build_tiny(tmp_path / "model", size="nano")
    overrides = ('benchmarks=[{"kind": "arithmetic", "num_problems": 5}]',
                 'profiles=[{"name": "greedy", "max_new_tokens": 4}]')
    engine, tokenizer = _load_engine(str(nano), config(nano, tmp_path))
    first = CountingEngine(engine)
    before = run_eval(config(nano, tmp_path / "seed0", *overrides), engine=first, tokenizer=tokenizer,
                      show_progress=False)
    reuse_samples(tmp_path / "seed0", tmp_path / "kept")
    reuse_samples(tmp_path / "kept", tmp_path / "seed1", say=True)
    assert "arithmetic.greedy.jsonl: the start's greedy samples from" in capsys.readouterr().out
    second = CountingEngine(engine)
    again = run_eval(config(nano, tmp_path / "seed1", *overrides), engine=second, tokenizer=tokenizer,
                     show_progress=False)
    assert first.prompts == 5 and second.prompts == 0 and again[0].per_problem == before[0].per_problem
    # a longer samples file where it is copied to is kept
    (tmp_path / "seed1" / "samples" / "arithmetic.greedy.jsonl").write_text("x" * 10**6)
    reuse_samples(tmp_path / "kept", tmp_path / "seed1")
    assert (tmp_path / "seed1" / "samples" / "arithmetic.greedy.jsonl").stat().st_size == 10**6
