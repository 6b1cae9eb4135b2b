"""Sampler precision and the sampler/trainer corrections as a run selects them: each named
correction by config, bf16 and fp16 engines against a float32 trainer, and the precision fallback."""

import math
import types

import pytest
import torch

from posttrain.algos import IS_CORRECTIONS
from posttrain.config import ConfigValueError
from posttrain.rl.config import CORRECTION_KINDS, CorrectionConfig, PrecisionFallbackConfig, RolloutConfig
from posttrain.rl.losses import importance_weights

# ratios trainer/sampler per token: (2, 1, 0.5) and (1.25, 0.8, padding)
_OLD = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3)], [math.log(0.5), math.log(0.4), 0.0]])
_SAMPLER = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.6)], [math.log(0.4), math.log(0.5), 0.0]])
_MASK = torch.tensor([[True, True, True], [True, True, False]])
_BATCH = types.SimpleNamespace(old_logp_BT=_OLD, behaviour_logp_BT=_SAMPLER, sampler_logp_BT=_SAMPLER,
                               scored_mask_BT=_MASK)


@pytest.mark.parametrize("kind,knobs,expected", [
    ("truncated", {"cap": 1.5}, [[1.5, 1.0, 0.5], [1.25, 0.8, 0.0]]),
    ("truncated", {"cap": 1.5, "level": "sequence"}, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
    ("rejection", {"low": 0.6, "high": 1.5}, [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]),
    ("mis", {"cap": 1.5}, [[0.0, 1.0, 0.5], [1.25, 0.8, 0.0]]),
    ("icepop", {"low": 0.6, "high": 1.6}, [[0.0, 1.0, 0.0], [1.25, 0.8, 0.0]]),
    ("icepop", {"low": 0.5, "high": 5.0}, [[2.0, 1.0, 0.5], [1.25, 0.8, 0.0]]),
    ("geo_mask", {"geo_low": 0.99, "geo_high": 1.01}, [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
    ("k3_mask", {"k3_max": 0.1}, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]),
])
def test_each_named_correction_is_selected_by_config(kind, knobs, expected):
    w, metrics = importance_weights(_BATCH, CorrectionConfig(kind=kind, **knobs))
    torch.testing.assert_close(w, torch.tensor(expected))
    assert "mismatch/kl" in metrics and all(isinstance(v, float) for v in metrics.values())
    if kind not in ("truncated",):
        assert "is/masked_token_frac" in metrics and "is/masked_seq_frac" in metrics


def test_every_config_kind_names_a_correction():
    assert set(CORRECTION_KINDS) - {"auto"} == set(IS_CORRECTIONS)


def test_unknown_correction_is_refused_in_one_line():
    with pytest.raises(ConfigValueError, match="must be one of") as e:
        CorrectionConfig(kind="tis")
    assert e.value.key == "kind" and "\n" not in str(e.value) and "icepop" in str(e.value)


@pytest.mark.parametrize("kind,knob", [("truncated", {"low": 0.5}), ("icepop", {"k3_max": 0.1}),
                                       ("rejection", {"cap": 2.0}), ("mis", {"high": 2.0}), ("icepop", {"cap": 2.0}),
                                       ("icepop", {"level": "token"}), ("rejection", {"geo_high": 1.1}), ("geo_mask", {"level": "sequence"}),
                                       ("k3_mask", {"level": "sequence"})])
def test_a_knob_of_another_correction_is_refused(kind, knob):
    with pytest.raises(ConfigValueError, match=f"no effect with kind={kind}") as e:
        CorrectionConfig(kind=kind, **knob)
    assert e.value.key == next(iter(knob))


# ------------------------------------------------------------------ 16-bit engines, float32 trainer


def _run(rl_overrides, reward_plugin, **extra):
    from posttrain.config import load_config
    from posttrain.jsonl import read_jsonl
    from posttrain.rl.config import RLConfig
    from posttrain.rl.run import run_rl

    cfg = load_config(RLConfig, None, rl_overrides(verifier=f"{reward_plugin}:letters", **extra))
    run_rl(cfg, printer=lambda *_: None)
    return [m for _, m in read_jsonl(f"{cfg.out_dir}/metrics.jsonl") if m.get("step", 0) > 0]


@pytest.mark.parametrize("dtype,low,high", [("float32", 0.0, 1e-5), ("bfloat16", 1e-4, 2e-2), ("float16", 1e-5, 5e-3)])
def test_a_16_bit_engine_shows_a_nonzero_bounded_gap_to_the_float32_trainer_and_trains(
        rl_overrides, reward_plugin, dtype, low, high):
    rows = _run(rl_overrides, reward_plugin, **{"rollout.engine_dtype": dtype})
    assert len(rows) == 2
    for m in rows:
        assert low <= m["mismatch/logprob_abs_diff_mean"] < high
        assert m["mismatch/logprob_abs_diff_max"] < 20 * high
        assert 0 <= m["mismatch/kl"] < 1e-3 and m["mismatch/ratio_outside_2x_frac"] == 0.0
        assert m["grad_norm"] > 0 and math.isfinite(m["loss"])  # the policy was updated from these samples
    assert "rollout/precision" not in rows[0]  # logged only with the fallback on


# ------------------------------------------------------------------ precision that rises with the gap


def test_fallback_decisions_by_hand():
    from posttrain.rl.precision import PrecisionFallback

    fb = PrecisionFallback(PrecisionFallbackConfig(kl_threshold=1e-3, quiet_steps=2), "bfloat16")
    seen = [(fb.observe(kl), fb.current) for kl in (1e-4, 2e-3, 0.0, 5e-3, 0.0, 1e-3, 2e-3)]
    assert seen == [(None, "bfloat16"),  # quiet in bf16: stay
                    ("float32", "float32"),  # loud: up
                    (None, "float32"),  # one quiet step
                    (None, "float32"),  # loud again in float32: the count restarts, stay up
                    (None, "float32"),
                    ("bfloat16", "bfloat16"),  # at the threshold counts as quiet: two in a row, down
                    ("float32", "float32")]
    off = PrecisionFallback(PrecisionFallbackConfig(), "bfloat16")
    assert off.observe(1.0) is None and off.current == "bfloat16"


def test_fallback_switches_the_engine_up_and_back_with_a_forced_gap(rl_overrides, reward_plugin, capsys):
    # a threshold no bf16 step stays under: up after every bf16 step, down after two float32 steps
    rows = _run(rl_overrides, reward_plugin, **{
        "rollout.engine_dtype": "bfloat16", "rollout.precision_fallback.kl_threshold": 1e-9,
        "rollout.precision_fallback.quiet_steps": 2, "num_steps": 6})
    assert [m["rollout/precision"] for m in rows] == [16, 32, 32, 16, 32, 32]
    assert [m.get("rollout/precision_switch") for m in rows] == [32, None, 16, 32, None, 16]
    for m in rows:  # float32 rollouts are the trainer's own numbers again: the weights and RoPE reloaded exactly
        if m["rollout/precision"] == 32:
            assert m["mismatch/logprob_abs_diff_max"] < 1e-5
        else:
            assert m["mismatch/logprob_abs_diff_mean"] > 1e-4
    events = [line for line in capsys.readouterr().out.splitlines() if "the engine samples in" in line]
    assert len(events) == 4 and "mismatch KL" in events[0] and "2 quiet steps" in events[1]


def test_the_report_draws_the_precision_and_lists_each_switch(rl_overrides, reward_plugin, tmp_path):
    import re

    from posttrain.eval.report import Run, find_runs, render_html

    _run(rl_overrides, reward_plugin, **{"rollout.engine_dtype": "bfloat16", "num_steps": 4,
                                         "rollout.precision_fallback.kl_threshold": 1e-9,
                                         "rollout.precision_fallback.quiet_steps": 2})
    page = render_html(find_runs([tmp_path / "run"]))
    panel = page[page.index("<h3>Rollout precision</h3>"):]
    panel = panel[:panel.index("</div>")]
    assert 'alt="Rollout precision" src="data:image/png;base64,' in panel
    cells = re.findall(r"<tr><td>run</td><td>(\d+)</td><td>([^<]+)</td><td>([^<]*)</td></tr>", panel)
    assert [(s, d) for s, d, _ in cells] == [("1", "float32"), ("3", "16-bit"), ("4", "float32")]
    assert all(float(kl) > 1e-9 for s, _, kl in cells if s != "3")  # the gap that moved it up
    without = Run(name="run", path=tmp_path, config_text="", metrics=[{"step": 1, "mismatch/kl": 1e-7}], evals=[],
                  notes=[])
    assert "Rollout precision" not in render_html([without])  # neither drawn nor listed as missing


def test_fallback_is_refused_where_it_cannot_act():
    from posttrain.rl.config import RLConfig

    on = PrecisionFallbackConfig(kl_threshold=1e-3)
    with pytest.raises(ConfigValueError, match="already float32"):
        RLConfig(rollout=RolloutConfig(precision_fallback=on))
    for backend in ("vllm", "sglang"):
        with pytest.raises(ConfigValueError, match=f"{backend} holds the dtype its server started with and cannot "
                                                   "change it at run time") as e:
            RLConfig(rollout=RolloutConfig(engine_dtype="bfloat16", backend=backend, urls=["http://127.0.0.1:1"],
                                           precision_fallback=on))
        assert e.value.key == "rollout.precision_fallback.kl_threshold" and "\n" not in str(e.value)
    for mode, runtime in (("async", "local"), ("sync", "ray"), ("async", "ray")):  # every engine posttrain runs
        RLConfig(mode=mode, runtime=runtime, rollout=RolloutConfig(engine_dtype="bfloat16", precision_fallback=on))


def test_fallback_state_survives_a_resume(rl_overrides, reward_plugin):
    # quiet_steps=3 and a threshold only float32 steps stay under: 16, 32, then 3 quiet steps in float32
    knobs = {"rollout.engine_dtype": "bfloat16", "rollout.precision_fallback.kl_threshold": 1e-9,
             "rollout.precision_fallback.quiet_steps": 3, "save_every": 1}
    assert [m["rollout/precision"] for m in _run(rl_overrides, reward_plugin, **knobs)] == [16, 32]
    rows = _run(rl_overrides, reward_plugin, **knobs, num_steps=5)  # resumes after step 2
    # a resume back at bf16 would give 16, 32, 16, 32, 32; one that forgot the quiet step 16, 32, 32, 32, 32
    assert [m["rollout/precision"] for m in rows] == [16, 32, 32, 32, 16]
    assert [m.get("rollout/precision_switch") for m in rows] == [32, None, None, 16, 32]
    assert rows[2]["mismatch/logprob_abs_diff_max"] < 1e-5  # the resumed engine really holds float32


def test_fallback_switches_the_async_engine_process(rl_overrides, reward_plugin):
    rows = _run(rl_overrides, reward_plugin, **{
        "mode": "async", "max_staleness": 0, "rollout.engine_dtype": "bfloat16",
        "rollout.precision_fallback.kl_threshold": 1e-9, "rollout.precision_fallback.quiet_steps": 1,
        "num_steps": 4, "asynchrony.self_test_max_kl": 1e-3})
    assert [m["rollout/precision"] for m in rows] == [16, 32, 16, 32]
    for m in rows:
        assert (m["mismatch/logprob_abs_diff_max"] < 1e-5) == (m["rollout/precision"] == 32)


def test_a_bf16_server_against_the_float32_trainer(rl_overrides, reward_plugin, nano_model_dir, tmp_path):
    """`posttrain serve --dtype bfloat16`: the server casts each float32 version the trainer writes
    and samples in bf16; the run sees the same kind of gap as with the in-process bf16 engine."""
    import json

    app = pytest.importorskip("posttrain.serve.app")
    from tests.rollout.test_http_engine import InThread

    engine, tokenizer, checksum = app.load_engine(nano_model_dir, dtype="bfloat16")
    server = InThread(app.create_app(engine, tokenizer, served_model_name="nano", model_path=nano_model_dir,
                                     checksum=checksum, access=app.Access(weights_root=tmp_path)))
    try:
        rows = _run(rl_overrides, reward_plugin, **{"rollout.backend": "openai", "rollout.urls": json.dumps([server.url]),
                                                    "rollout.weights_dir": tmp_path / "weights"})
    finally:
        server.stop()
    assert next(engine.model.parameters()).dtype == torch.bfloat16 and engine.version == 2
    for m in rows:
        assert 1e-4 <= m["mismatch/logprob_abs_diff_mean"] < 2e-2 and m["mismatch/kl"] < 1e-3
        assert m["grad_norm"] > 0


def test_fallback_switches_a_posttrain_server(rl_overrides, reward_plugin, nano_model_dir, tmp_path):
    """backend=openai against `posttrain serve --dtype bfloat16`: each reload carries the dtype, the
    server casts itself, and the float32 steps have the trainer's own numbers."""
    import json

    app = pytest.importorskip("posttrain.serve.app")
    from tests.rollout.test_http_engine import InThread

    engine, tokenizer, checksum = app.load_engine(nano_model_dir, dtype="bfloat16")
    server = InThread(app.create_app(engine, tokenizer, served_model_name="nano", model_path=nano_model_dir,
                                     checksum=checksum, access=app.Access(weights_root=tmp_path)))
    try:
        rows = _run(rl_overrides, reward_plugin, **{
            "rollout.backend": "openai", "rollout.urls": json.dumps([server.url]),
            "rollout.weights_dir": tmp_path / "weights", "rollout.engine_dtype": "bfloat16",
            "rollout.precision_fallback.kl_threshold": 1e-9, "rollout.precision_fallback.quiet_steps": 1,
            "num_steps": 3})
    finally:
        server.stop()
    assert [m["rollout/precision"] for m in rows] == [16, 32, 16]
    assert rows[1]["mismatch/logprob_abs_diff_max"] < 1e-5 < rows[0]["mismatch/logprob_abs_diff_mean"]
    assert next(engine.model.parameters()).dtype == torch.float32  # step 3's gap raised it again


@pytest.mark.slow
def test_fallback_at_two_colocated_ranks_equals_one_process(rl_overrides, reward_plugin, tmp_path, torchrun,
                                                            monkeypatch):
    """Every rank's engine takes the dtype with the streamed weights: two ranks sample in the same
    precision as one process, step by step, and the same tokens."""
    import json

    from posttrain.cli import main

    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the ranks import the reward module too
    args = [a for a in rl_overrides(verifier=f"{reward_plugin}:letters", num_steps=3, **{
        "rollout.engine_dtype": "bfloat16", "rollout.precision_fallback.kl_threshold": 1e-9,
        "rollout.precision_fallback.quiet_steps": 1, "optim.eps": 1e-5}) if not a.startswith("out_dir=")]
    assert main(["rl", *args, f"out_dir={tmp_path / 'one'}"]) == 0
    torchrun(2, "rl", *args, f"out_dir={tmp_path / 'two'}")
    one, two = ([m for m in map(json.loads, (tmp_path / d / "metrics.jsonl").read_text().splitlines())
                 if m.get("step", 0) > 0] for d in ("one", "two"))
    assert [m["rollout/precision"] for m in two] == [m["rollout/precision"] for m in one] == [16, 32, 16]
    assert {m["rollout/generating_ranks"] for m in two} == {2}
    for a, b in zip(one, two):
        assert b["reward/mean"] == a["reward/mean"]  # the same tokens, in the same precision
        assert (b["mismatch/logprob_abs_diff_max"] < 1e-5) == (b["rollout/precision"] == 32)


@pytest.mark.parametrize("overrides,key", [
    (["correction.kind=icepop", "correction.cap=2"], "correction.cap"),  # the value is the default: still refused
    (["correction.kind=rejection", "correction.level=token", "correction.cap=2.0"], "correction.cap"),
    (["correction.kind=masked"], "correction.kind"),
    (["correction.kind=icepop", "correction.low=1.5"], "correction.low"),
])
def test_the_rl_command_refuses_a_correction_knob_in_one_line(rl_overrides, capsys, overrides, key):
    from posttrain.cli import main

    assert main(["rl", *rl_overrides(), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err


def test_icepop_reads_both_bounds_from_the_config(rl_overrides):
    from posttrain.config import load_config
    from posttrain.rl.config import RLConfig

    cfg = load_config(RLConfig, None, rl_overrides(**{"correction.kind": "icepop", "correction.low": 0.5,
                                                      "correction.high": 5}))
    assert cfg.correction.options() == {"low": 0.5, "high": 5.0}
    w, _ = importance_weights(_BATCH, cfg.correction)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5], [1.25, 0.8, 0.0]]))
    resolved = load_config(RLConfig, None, rl_overrides()).correction  # auto: truncated, its knobs recorded
    assert (resolved.kind, resolved.level, resolved.cap, resolved.low, resolved.high) == ("truncated", "token", 2.0, None, None)
