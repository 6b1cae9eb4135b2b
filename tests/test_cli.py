"""The `posttrain` command itself: commands that never train leave without importing torch."""

import json
import signal
import subprocess
import sys

import pytest

from tests.eval.test_report import write_rl

# Runs the command as the console script does (`posttrain.cli:entry`, exit included), then says
# whether torch was imported on the way in or out.
PROBE = """
import atexit, sys
atexit.register(lambda: print("TORCH", "torch" in sys.modules, file=sys.stderr))
sys.argv = ["posttrain", *sys.argv[1:]]
from posttrain.cli import entry
entry()
"""


def _run(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("args", [["--help"], ["report", "--help"], ["sandbox", "--help"]])
def test_help_never_imports_torch(args):
    r = _run(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TORCH False" in r.stderr, r.stderr[-2000:]


def test_report_never_imports_torch(tmp_path):
    write_rl(tmp_path / "run")
    r = _run("report", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TORCH False" in r.stderr, r.stderr[-2000:]


def test_sandbox_check_of_one_record_never_imports_torch(tmp_path):
    from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
    from posttrain.sandbox.worker import SandboxConfig

    try:
        SandboxPool(SandboxConfig(workers=1)).close()
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    record = {"id": "sq", "program": "def f(x):\n    return x * x\n",
              "tests": "def check(candidate):\n    assert candidate(3) == 9\n", "entry_point": "f"}
    (tmp_path / "one.jsonl").write_text(json.dumps(record) + "\n")
    r = _run("sandbox", "check", tmp_path / "one.jsonl", "--workers", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[0])["outcome"] == "PASS"
    assert "TORCH False" in r.stderr, r.stderr[-2000:]


SLEEPER = r"""
import atexit, pathlib, sys, time, types
import posttrain.cli as cli
mod = types.ModuleType("sleeper")
mod.add_arguments = lambda parser: parser.add_argument("marker")
def run(args):
    atexit.register(pathlib.Path(args.marker).write_text, "cleaned up")  # as a launched server's stop is
    print("ready", flush=True)
    time.sleep(60)
mod.run = run
sys.modules["sleeper"] = mod
cli.COMMANDS["sleep"] = ("sleeper", "sleeps")
sys.exit(cli.main(sys.argv[1:]))
"""


def test_sigterm_unwinds_a_command_so_its_cleanup_runs(tmp_path):
    """A scheduler's SIGTERM must stop what a run started (vLLM servers, engine processes: their
    atexit hooks), not kill the interpreter past them."""
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "sleep", str(marker)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert err.strip() == "posttrain sleep: terminated"
    assert marker.read_text() == "cleaned up"
