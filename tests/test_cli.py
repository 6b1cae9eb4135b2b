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


def test_a_rank_that_leaves_a_bad_input_to_process_0_waits_for_it_to_say_it(tmp_path):
    """Under torchrun the first rank to exit with an error stops the others: a rank that does not
    print the bad-input line waits (process 0's exit stops it, quietly) so that process 0, slower to
    the same error, is not stopped before saying it; process 0 itself says it and leaves at once."""
    env = {**__import__("os").environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    other = subprocess.Popen([sys.executable, "-c", PROBE, "report", tmp_path / "missing"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    r = _run("report", tmp_path / "missing")
    assert r.returncode == 2 and "posttrain report: error:" in r.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        other.wait(timeout=3)  # process 0 has long finished; the other rank still waits
    other.send_signal(signal.SIGTERM)  # as torchrun stops it once process 0 has exited
    _, err = other.communicate(timeout=30)
    assert other.returncode == 2 and "error" not in err and "Traceback" not in err, err


def _keys(cls, prefix=""):
    """Every dotted key of a config class, a list of sections' entries as ``name[].key``."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        item = (typing.get_args(tp) or [None])[0] if typing.get_origin(tp) is list else None
        if dataclasses.is_dataclass(tp):
            yield from _keys(tp, f"{prefix}{f.name}.")
        elif dataclasses.is_dataclass(item):
            yield f"{prefix}{f.name}"
            yield from _keys(item, f"{prefix}{f.name}[].")
        else:
            yield f"{prefix}{f.name}"


def _config_classes():
    from posttrain.eval.runner import EvalConfig
    from posttrain.rl.config import RLConfig
    from posttrain.rl.distill import DistillConfig
    from posttrain.train.dpo import DPOConfig
    from posttrain.train.rm import RMConfig
    from posttrain.train.sft import SFTConfig

    return {"sft": SFTConfig, "rl": RLConfig, "rm": RMConfig, "dpo": DPOConfig, "distill": DistillConfig,
            "eval": EvalConfig}


def test_every_command_has_help_and_each_config_key_is_listed_with_type_default_and_meaning(capsys):
    """The README's promise: every command's --help lists every config key with its type, default and
    meaning; a command without a config documents each of its options."""
    import argparse
    import importlib
    import re

    from posttrain.cli import COMMANDS, main

    configs = _config_classes()
    for name, (module, _) in COMMANDS.items():
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and f"usage: posttrain {name}" in out, name
        parser = argparse.ArgumentParser()
        importlib.import_module(module).add_arguments(parser)
        undocumented = [a.dest for a in parser._actions if a.dest != "help" and not (a.help or "").strip()
                        and not isinstance(a, argparse._SubParsersAction)]  # subcommands: their own help
        assert not undocumented, f"{name}: options without help: {undocumented}"
        for key in _keys(configs[name]) if name in configs else ():
            line = re.search(rf"^  {re.escape(key)} \((.+), default (.*)\)\n      (.*)$", out, re.MULTILINE)
            assert line and line[3].strip(), f"posttrain {name} --help: no type, default and meaning for {key}"
