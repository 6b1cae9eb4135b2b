"""Run directories and progress bars: the per-step logs on resume and on a fresh start; plain
progress lines off a terminal while the bar runs, not one picture at the end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posttrain.errors import UserError
from posttrain.tracking import PROGRESS_EVERY_ENV, progress_every_s

BAR = """
import time
from posttrain.tracking import progress_bar
with progress_bar(True) as bar:
    t = bar.add_task("sft", total=8, info="")
    for i in range(8):
        time.sleep(0.15)
        bar.update(t, advance=1, info=f"loss {1 / (i + 1):.3f}")
print("sft done")
"""


def test_off_a_terminal_a_bar_prints_plain_lines_as_it_goes(monkeypatch):
    r = subprocess.run([sys.executable, "-c", BAR], capture_output=True, text=True, timeout=120, check=True,
                       env={**_env(), PROGRESS_EVERY_ENV: "0.3"})
    lines = r.stdout.splitlines()
    assert lines[-1] == "sft done"
    plain = [line for line in lines if line.startswith("sft ") and "/8 " in line]
    assert len(plain) >= 2 and plain[0].startswith(("sft 2/8 ", "sft 3/8 ")), lines  # while it ran
    assert " eta " in plain[0] and "loss 0." in plain[0]
    assert "\x1b[" not in r.stdout  # no terminal codes in a log file


def test_without_the_variable_lines_come_every_30_s_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.delenv(PROGRESS_EVERY_ENV, raising=False)
    assert progress_every_s() == 30.0
    monkeypatch.setenv(PROGRESS_EVERY_ENV, "soon")
    with pytest.raises(UserError, match=f"{PROGRESS_EVERY_ENV}: expected seconds > 0, got 'soon'"):
        progress_every_s()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")}


def test_step_logs_are_cut_back_on_resume_and_removed_on_a_fresh_start(tmp_path):
    """Both per-step files: a resume at step 2 keeps the lines of steps 0-2 (step 0: the start's
    eval), a fresh start leaves neither an earlier run's metrics nor its samples."""
    import json

    from posttrain.tracking import MetricsLogger

    for name in ("metrics.jsonl", "samples.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps({"step": s, "n": i}) + "\n"
                                             for i, s in enumerate([0, 1, 2, 2, 3, 3])))
    MetricsLogger(tmp_path, resume_step=2).close()
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert [json.loads(line)["n"] for line in (tmp_path / name).read_text().splitlines()] == [0, 1, 2, 3], name
    MetricsLogger(tmp_path).close()
    assert (tmp_path / "metrics.jsonl").read_text() == "" and not (tmp_path / "samples.jsonl").exists()
