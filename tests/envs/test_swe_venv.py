"""SWE tasks whose project needs a dependency: a virtual environment made here (no network) holds
it, the sandbox binds its site-packages read-only after the project's tree on the import path,
and its .pth files are never run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.envs.audit import swe_policies
from posttrain.envs.config import EnvConfig, env_factory
from posttrain.envs.swe import SweEnv, load_task, venv_site
from posttrain.envs.tools import format_call
from posttrain.errors import UserError
from posttrain.outcome import OutcomeClass
from posttrain.sandbox.pool import SandboxPool, SandboxUnavailable
from posttrain.sandbox.worker import SandboxConfig
from posttrain.verifiers import code
from tests.envs.swe_project import FILES, make_record

# The project's code and tests import `tinydep`, which only the venv has.
DEP_FILES = {
    **FILES,
    "src/calc/ops.py": FILES["src/calc/ops.py"].replace("def mul(a, b):\n    return a * b",
                                                        "def mul(a, b):\n    return tinydep.times(a, b)")
                                              .replace("def add", "import tinydep\n\n\ndef add", 1),
    "tests/test_mul.py": FILES["tests/test_mul.py"] + '''

def test_the_venv_is_read_only():
    import errno, os, tinydep
    folder = os.path.dirname(tinydep.__file__)
    assert os.statvfs(folder).f_flag & os.ST_RDONLY
    try:
        open(os.path.join(folder, "planted.py"), "w")
    except OSError as e:
        assert e.errno == errno.EROFS, e
    else:
        raise AssertionError("wrote into the venv")
''',
}
P2P = ["tests/test_mul.py::test_mul", "tests/test_mul.py::test_mul_zero", "tests/test_mul.py::test_the_venv_is_read_only"]
PYTHON = SandboxConfig().python


def _make_venv(root: Path) -> Path:
    """A venv for the sandbox's interpreter with `tinydep` installed from a local folder, a stale
    correct `calc` (were the venv before the tree, the null patch would pass) and a .pth file that
    would end the verdict's process were it run."""
    src = root / "tinydep-src"
    (src / "tinydep").mkdir(parents=True)
    (src / "tinydep" / "__init__.py").write_text("def times(a, b):\n    return a * b\n")
    (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
                                        '[project]\nname = "tinydep"\nversion = "1.0"\n')
    venv = root / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The wheel is built here (setuptools is in this environment), then installed into the venv.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                    "-w", str(root / "dist"), str(src)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", *map(str, (root / "dist").glob("*.whl"))], check=True)
    site = Path(venv_site(str(venv), PYTHON))
    (site / "calc").mkdir()
    (site / "calc" / "__init__.py").write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\n"
                                               "def total(xs):\n    return sum(xs)\n")
    (site / "zz_exit.pth").write_text("import os; os._exit(0)\n")
    return venv


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not Path(PYTHON).exists():
        pytest.skip(f"no {PYTHON}")
    return _make_venv(tmp_path_factory.mktemp("venv"))


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    fix = {"src/calc/ops.py": DEP_FILES["src/calc/ops.py"].replace("return a - b", "return a + b")}
    rec = make_record(tmp_path_factory.mktemp("swe-dep"), files=DEP_FILES, fix=fix, p2p=P2P)
    assert "times" not in rec["patch"]  # the gold patch keeps the dependency
    assert (Path(rec["repo_path"]) / "src/calc/ops.py").read_text().startswith("import tinydep")
    return rec


@pytest.fixture(scope="module")
def shared(venv):
    """The shared pool's settings for one sandbox; SweEnv(venv=...) takes its own pool from them."""
    code.configure(SandboxConfig(workers=1, timeout_s=30.0))
    try:
        SandboxPool(SandboxConfig(workers=1, timeout_s=30.0)).close()
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    yield
    code.configure(SandboxConfig())


def play(env, record, turns):
    env.reset(record)
    for text in turns:
        result = env.step(text)
        if result.done:
            return result
    raise AssertionError("the turns never submitted")


def test_with_the_venv_oracle_passes_and_null_fails(shared, venv, record):
    oracle = play(SweEnv(venv=str(venv)), record, swe_policies(load_task(record))["oracle"])
    assert oracle.outcome.cls is OutcomeClass.PASS and oracle.reward == 1.0, oracle.outcome
    assert oracle.info["scores"]["pass_to_pass"] == 1.0  # the read-only check among them
    null = play(SweEnv(venv=str(venv)), record, [format_call("submit", {})])
    assert (null.outcome.cls, null.outcome.reason) == (OutcomeClass.MODEL_FAIL, "wrong_answer"), null.outcome
    assert (null.info["scores"]["fail_to_pass"], null.info["scores"]["pass_to_pass"]) == (0.0, 1.0)
    env = SweEnv(venv=str(venv), max_output_chars=4000)
    env.reset(record)
    out = env.step(format_call("run_tests", {"target": "tests/test_mul.py"})).observation[0]["content"]
    assert "3 passed" in out, out


def test_without_the_venv_the_dependency_is_missing(shared, record):
    env = SweEnv(max_output_chars=4000)
    env.reset(record)
    out = env.step(format_call("run_tests", {"target": "tests/test_mul.py"})).observation[0]["content"]
    assert "No module named 'tinydep'" in out, out
    oracle = play(SweEnv(), record, swe_policies(load_task(record))["oracle"])
    assert (oracle.outcome.cls, oracle.outcome.reason) == (OutcomeClass.MODEL_FAIL, "wrong_answer")


def test_a_pool_that_does_not_bind_the_venv_is_refused(venv):
    with pytest.raises(ValueError, match="does not bind"):
        SweEnv(venv=str(venv), pool=type("P", (), {"cfg": SandboxConfig()})())


def test_the_venv_is_checked_when_the_config_is_loaded(tmp_path, venv):
    with pytest.raises(UserError, match=f"env.options.venv: {tmp_path} is not a virtual environment"):
        env_factory(EnvConfig(name="swe", options={"venv": str(tmp_path)}))
    with pytest.raises(ValueError, match="no site-packages for the sandbox's python3.9"):
        venv_site(str(venv), "/usr/bin/python3.9")
    assert env_factory(EnvConfig(name="swe", options={"venv": str(venv)}))().site.endswith("site-packages")


def test_env_audit_with_the_venv(tmp_path, venv, record, capsys):
    records = tmp_path / "swe.jsonl"
    records.write_text(json.dumps(record) + "\n")
    out = tmp_path / "audit"
    assert main(["env-audit", str(records), "--out", str(out), "--workers", "1", "--timeout", "30",
                 "--venv", str(venv)]) == 0, capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass_rate"].pop("oracle") == 1.0 and not any(summary["pass_rate"].values())
    assert main(["env-audit", str(records), "--out", str(out), "--venv", str(tmp_path)]) == 2
    assert f"--venv: {tmp_path} is not a virtual environment" in capsys.readouterr().err


def test_a_site_packages_that_is_not_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match=f"site_packages: {tmp_path}/none is not a folder"):
        SandboxConfig(site_packages=str(tmp_path / "none"))
