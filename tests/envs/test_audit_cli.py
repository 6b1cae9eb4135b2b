"""`posttrain env-audit`'s limits: the verdict's time limit and the sandbox's CPU limit reach the
sandbox pool and the environment (no sandbox started: the pool is replaced here)."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.sandbox.pool import SandboxUnavailable
from tests.envs.swe_project import make_record


@pytest.fixture
def seen(monkeypatch):
    """The SandboxConfig env-audit makes; the pool then refuses to start (exit 2, nothing played)."""
    got = []

    def pool(cfg):
        got.append(cfg)
        raise SandboxUnavailable("not started in this test")

    monkeypatch.setattr("posttrain.sandbox.pool.SandboxPool", pool)
    return got


@pytest.mark.parametrize("args, cpu_s", [([], 61), (["--timeout", "20"], 30), (["--timeout", "45"], 46),
                                         (["--timeout", "45", "--cpu-limit", "90"], 90)])
def test_the_cpu_limit_follows_the_time_limit_or_the_option(tmp_path, seen, args, cpu_s):
    path = tmp_path / "swe.jsonl"
    path.write_text(json.dumps(make_record(tmp_path)) + "\n")
    assert main(["env-audit", str(path), "--out", str(tmp_path / "o"), *args]) == 2
    assert seen[-1].cpu_s == cpu_s


def test_a_bad_cpu_limit_is_one_line(tmp_path, seen, capsys):
    assert main(["env-audit", "embedded", "--n", "1", "--cpu-limit", "0"]) == 2
    assert "--cpu-limit must be >= 1" in capsys.readouterr().err and not seen
