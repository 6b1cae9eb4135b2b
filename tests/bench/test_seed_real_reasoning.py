"""bench/seed_real_reasoning.py: the figures of a set of judged samples, worked by hand."""

import importlib.util
from pathlib import Path

import pytest

from posttrain.eval.results import SampleRecord

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "seed_real_reasoning.py"
THOUGHT = "<think>Add 3 to x.</think>\n```python\ndef add_k(x):\n    return x + 3\n```"
NO_TRACE = "```python\ndef add_k(x):\n    return x + 3\n```"
BROKEN = "<think>Add 3 to x.</think>\n```python\ndef add_k(x:\n```"
UNCLOSED = "<think>Add 3 to x and return"


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.spec_from_file_location("seed_real_reasoning", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _s(pid: str, i: int, completion: str, passed: bool, tokens: int, finish: str = "eos") -> SampleRecord:
    return SampleRecord(problem_id=pid, sample_index=i, completion=completion, outcome="PASS" if passed else "MODEL_FAIL",
                        completion_tokens=tokens, finish_reason=finish)


def _samples() -> list[SampleRecord]:
    # family_a: 2 passes of 4 (a pass spread), every sample well formatted but one without a trace.
    # family_b: no pass; 1 of 4 formatted: its spread is the 0.05 bonus alone.
    # Real_1: no pass, none formatted (a syntax error after the trace, an unclosed trace cut at the
    # limit): no spread at all. family_c: every sample passes and is formatted: no spread either.
    return [_s("family_a", 0, THOUGHT, True, 20), _s("family_a", 1, THOUGHT, True, 20),
            _s("family_a", 2, THOUGHT, False, 20), _s("family_a", 3, NO_TRACE, False, 12),
            _s("family_b", 0, THOUGHT, False, 20), _s("family_b", 1, NO_TRACE, False, 12),
            _s("family_b", 2, NO_TRACE, False, 12), _s("family_b", 3, UNCLOSED, False, 64, "length"),
            _s("Real_1", 0, BROKEN, False, 16), _s("Real_1", 1, UNCLOSED, False, 64, "length"),
            _s("family_c", 0, THOUGHT, True, 20), _s("family_c", 1, THOUGHT, True, 20)]


def test_the_figures_of_a_samples_set_worked_by_hand(probe):
    st = probe.group_stats(_samples())
    assert st["problems"] == 4 and st["samples"] == 12
    assert st["format"] == pytest.approx(6 / 12)  # family_a 3, family_b 1, family_c 2
    assert st["pass1"] == pytest.approx(4 / 12)
    assert st["groups_pass_spread"] == 1  # family_a only: family_c passes all
    assert st["groups_bonus_only"] == 1  # family_b: Real_1 is all unformatted, family_a counts as a pass spread
    assert st["tokens"] == pytest.approx((20 * 6 + 12 * 3 + 64 * 2 + 16) / 12)
    assert st["cut"] == pytest.approx(2 / 12)


def test_the_draw_is_split_into_the_family_and_the_real_records(probe):
    parts = probe.split_by_source(_samples())
    assert {s.problem_id for s in parts["family"]} == {"family_a", "family_b", "family_c"}
    assert {s.problem_id for s in parts["kodcode"]} == {"Real_1"}
    row = probe.table_row("m", "train draw", probe.group_stats(parts["kodcode"]))
    assert row == "| m | train draw (1) | 2 | 0.0% | 0.0% | 0 of 1 | 0 | 40 | 50% |"
    assert probe.markdown([("m", "w", probe.group_stats(parts["kodcode"]))]).splitlines()[1].count("---") == 9
