"""The SWE verdict's sentinels: required tests renamed, must-fail copies beside them, the host's
reading of a report (no sandbox here: the rewritten modules run in this process)."""

from __future__ import annotations

import pytest

from posttrain.envs.swe_sentinels import Hidden, hide

MODULE = '''import pytest


def helper():
    return 3


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n in (1, 2)


def test_early_return():
    """Ends early."""
    text = """two
lines"""
    if text:
        return
    raise AssertionError("unreachable")


def test_skips():
    pytest.skip("not here")


class TestBox:
    def test_method(self):
        assert helper() == 3


def test_other():
    assert helper() == 3
'''
F2P = ["tests/test_m.py::test_param[1]", "tests/test_m.py::test_early_return", "tests/test_m.py::TestBox::test_method"]
P2P = ["tests/test_m.py::test_other"]


def _run(text: str, node_id: str):
    """Run the test ``node_id`` names (its class's method, or the function) from module ``text``."""
    scope: dict = {}
    exec(compile(text, "test_m.py", "exec"), scope)
    *classes, name = node_id.split("::")[1:]
    name = name.partition("[")[0]
    if classes:
        return getattr(scope[classes[0]](), name)()
    fn = scope[name]
    return fn(1) if "[" in node_id else fn()


@pytest.fixture
def hidden() -> Hidden:
    return hide({"tests/test_m.py": MODULE}, F2P, P2P)


def test_required_tests_are_renamed_and_mapped_back(hidden):
    assert sorted(hidden.original.values()) == sorted(F2P + P2P)
    assert all(new != old and new.split("::")[-1].startswith("test_") for new, old in hidden.original.items())
    text = hidden.files["tests/test_m.py"]
    assert "def test_param" not in text and "def test_other" not in text and "def helper" in text
    assert '"""two\nlines"""' in text  # a string spanning lines is never re-indented


def test_renamed_tests_behave_as_before_and_sentinels_always_fail(hidden):
    text = hidden.files["tests/test_m.py"]
    for new in hidden.original:
        _run(text, new)  # the renamed originals pass, as the originals do
    assert len(hidden.sentinels) == 3  # one per FAIL_TO_PASS test
    params = {new.partition("[")[0] for new in hidden.original if "[" in new}
    for sentinel, source in hidden.sentinels.items():
        with pytest.raises(AssertionError):  # after an early return or a skip too
            _run(text, sentinel + "[1]" * (source in params))


def test_each_sentinel_runs_beside_its_original(hidden):
    for sentinel, source in hidden.sentinels.items():
        at = next(i for i, node_id in enumerate(hidden.ids) if node_id.partition("[")[0] == source)
        assert sentinel in hidden.ids[max(at - 1, 0):at + 2]


def test_a_report_in_which_a_sentinel_passes_or_vanishes_is_tampering(hidden):
    honest = {k: "passed" for k in hidden.original} | {s: "failed" for s in hidden.sentinels}
    assert hidden.tampered(honest) == []
    assert hidden.outcomes(honest) == {k: "passed" for k in F2P + P2P} | {s: "failed" for s in hidden.sentinels}
    sentinel, source = next(iter(hidden.sentinels.items()))
    assert len(hidden.tampered({**honest, sentinel: "passed"})) == 1
    missing = {k: v for k, v in honest.items() if k != sentinel}
    assert len(hidden.tampered(missing)) == 1
    source_failed = {k: "failed" if k.partition("[")[0] == source else v for k, v in missing.items()}
    assert hidden.tampered(source_failed) == []  # the original failed too: nothing claimed
    everything = {k: "passed" for k in hidden.ids}
    assert len(hidden.tampered(everything)) == 3


def test_fresh_names_every_time():
    first, second = hide({"tests/test_m.py": MODULE}, F2P, P2P), hide({"tests/test_m.py": MODULE}, F2P, P2P)
    assert not set(first.ids) & set(second.ids)


def test_tests_it_cannot_find_keep_their_names():
    ids = ["tests/test_m.py::test_missing", "tests/test_m.py::test_other"]
    text = MODULE + "\n\ntest_alias = test_other\n"  # test_other named twice: not renamed
    hidden = hide({"tests/test_m.py": text}, ids, [])
    assert hidden.ids == ids and hidden.sentinels == {}
