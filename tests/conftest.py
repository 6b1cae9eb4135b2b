"""Shared fixtures: the embedded nano model (built once per test session, no download)."""

from __future__ import annotations

import os
import re
import shutil

# The tests run tiny models whose kernels are too small to gain from intra-op threads; on a busy
# machine, torch's threads wait at every kernel's barrier for a core (seen: 25x slower). One
# thread here, and in every subprocess the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Lanes that share one costly thing per session (a vLLM server, the tinker servers, the docs
# lane's trained workspace, a verifiers environment, the real model) run in one process; every
# other lane spreads its test files over the cores (`-n auto --dist loadfile` in pyproject.toml:
# a file's tests, and so its module fixtures, stay on one worker). Each runs one thread (above).
ONE_PROCESS_LANES = ("vllm", "verifiers", "tinker", "docs", "real")
MAX_WORKERS = 4  # each worker holds torch, a nano model and, when a test asks, a local Ray


@pytest.hookimpl(optionalhook=True)  # a run without pytest-xdist never calls it
def pytest_xdist_auto_num_workers(config):
    """How many pytest-xdist workers ``-n auto`` starts: 0 (no workers, this process runs the
    tests) for the one-process lanes or a one-core machine, else a worker a core up to
    `MAX_WORKERS`. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides, as with xdist's own hook."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    expr = config.getoption("markexpr") or ""
    if any(re.search(rf"(?<!not )\b{lane}\b", expr) for lane in ONE_PROCESS_LANES):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if cores < 2 else min(cores, MAX_WORKERS)


def pytest_collection_modifyitems(config, items):
    """Test files in the order pytest-xdist hands them to workers: files holding a `long` test
    first, then by how many tests they hold (xdist's own order, which `--no-loadscope-reorder` in
    pyproject.toml replaces with this one). Why: by count alone, a file whose one test takes minutes
    comes last and runs alone at the end of the lane while the other workers wait (seen: the
    repository learning run, the slow lane's last 8 minutes)."""
    _deselect_release_unless_asked(config, items)
    counts: dict = {}
    for item in items:
        counts[item.path] = counts.get(item.path, 0) + 1
    long_files = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: (item.path not in long_files, -counts[item.path]))  # stable: a file's tests keep their order


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture
def tmp_path(request, tmp_path_factory):
    """pytest's ``tmp_path``, removed when its test passes (a failing test's stays, to read; a passing
    session's whole base folder goes at its end: ``tmp_path_retention_policy`` in pyproject.toml).
    Why: the real model's checkpoints are GBs, and CI's lanes share one disk. Kept until the session
    ends for a test marked ``vllm``: the session's vLLM server loads adapters by path and may read
    one again after the test (a LoRA evicted from its slots), and a missing adapter folder ends its
    engine for every later test."""
    path = tmp_path_factory.mktemp(re.sub(r"\W", "_", request.node.name)[:30], numbered=True)
    yield path
    if not request.node.stash.get(FAILED, False) and request.node.get_closest_marker("vllm") is None:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def nano_model_dir(tmp_path_factory):
    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    return build_tiny(tmp_path_factory.mktemp("nano"), "nano", seed=0)


@pytest.fixture(scope="session")
def arith_data_dir(tmp_path_factory):
    """Arithmetic SFT/RL records (2-digit × 2-digit, reasoning traces)."""
    from posttrain.tasks.arithmetic import write_arithmetic

    out = tmp_path_factory.mktemp("arith")
    write_arithmetic(out, digits=2, ops="x", n_train=400, n_eval=50, fmt="trace", seed=0)
    return out


@pytest.fixture(scope="session")
def torchrun():
    """``torchrun(N, *args)``: ``torchrun --standalone --nproc-per-node N -m posttrain ARGS`` (gloo on
    the CPU, one thread a rank); raises with the ranks' stderr unless ``check=False``."""
    return _torchrun


def _torchrun(nproc: int, *args, timeout: int = 300, check: bool = True):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "posttrain", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if check and r.returncode != 0:
        raise AssertionError(f"torchrun failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return r


@pytest.fixture(scope="session")
def torchrun_each(tmp_path_factory):
    """``torchrun_each(N, {name: argv}, env={})``: every command line in ONE launch of N ranks, in
    order (tests/torchrun_each.py: a launch's imports cost more CPU than a test's steps); returns
    ({name: process 0's stdout of that command}, the ranks' stderr); raises unless all exit 0, or with
    ``last_fails``, unless all but the last exit 0 and the last (and so the launch) does not."""
    import json
    import subprocess
    import sys

    def launch(nproc: int, cases: dict, env: dict | None = None, timeout: int = 600,
               last_fails: bool = False) -> tuple[dict, str]:
        spec = tmp_path_factory.mktemp("torchrun-each") / "cases.json"
        spec.write_text(json.dumps([[name, list(map(str, argv))] for name, argv in cases.items()]))
        driver = os.path.join(os.path.dirname(__file__), "torchrun_each.py")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", driver, str(spec)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        out, codes = {}, {}
        for part in r.stdout.split("\n@@case ")[1:]:
            name, _, rest = part.partition("\n")
            out[name], _, code = rest.partition(f"\n@@code {name} ")
            codes[name] = int(code.split()[0]) if code else None
        *first, last = cases
        if last_fails:  # the last command fails, which ends the launch; the ones before it pass
            ok = r.returncode != 0 and all(codes.get(n) == 0 for n in first) and codes.get(last) not in (0, None)
        else:
            ok = r.returncode == 0 and all(codes.get(n) == 0 for n in cases)
        if not ok:
            raise AssertionError(f"torchrun ended {r.returncode}, commands {codes}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        return out, r.stderr

    return launch


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One local Ray for the whole test session (start-up costs seconds): 8 logical CPUs, so tests
    can place several engine and verifier actors on a 2-core machine. Yields the ray module."""
    ray = pytest.importorskip("ray")
    from posttrain.distributed.cluster import connect

    connect("", num_cpus=8)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """The embedded tiny model (vLLM's CPU attention has no kernel for the nano model's head size 16)."""
    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    return build_tiny(tmp_path_factory.mktemp("tiny"), "tiny", seed=0)


def _vllm_session_server(tmp_path_factory, model_dir, lora_rank: int):
    from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers

    spec = ServerSpec(model=str(model_dir), max_model_len=512, lora_rank=lora_rank, max_loras=2)
    servers = VLLMServers(spec, 1, tmp_path_factory.mktemp("vllm-logs"), printer=lambda *_: None)
    servers.start()
    return servers


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory, vllm_model_dir):
    """One real vLLM server (from .venv-vllm, `bash scripts/setup.sh vllm`) on the tiny model for
    the whole test session: start-up costs 30-100 s. Yields the `VLLMServers` (``.urls[0]``).
    LoRA is off: a server with LoRA on runs the sync probe alone (`VLLMDialect.probe_alone`), so
    pushes that freeze requests in flight are tested here."""
    servers = _vllm_session_server(tmp_path_factory, vllm_model_dir, lora_rank=0)
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def vllm_lora_server(tmp_path_factory, vllm_model_dir):
    """A second session server, started with runtime LoRA (adapters up to rank 32, the seed recipe's,
    two loaded at once) for the adapter tests."""
    servers = _vllm_session_server(tmp_path_factory, vllm_model_dir, lora_rank=32)
    yield servers
    servers.stop()


def _deselect_release_unless_asked(config, items) -> None:
    """A `release` test runs only under a marker expression that asks for `release`: one that is
    also in a CI lane's marker (say a slow file's module mark) would otherwise run there for tens of
    minutes (seen: the full code demo in the slow lane)."""
    if re.search(r"(?<!not )\brelease\b", config.getoption("markexpr") or ""):
        return
    release = [item for item in items if item.get_closest_marker("release")]
    if release:
        config.hook.pytest_deselected(items=release)
        items[:] = [item for item in items if not item.get_closest_marker("release")]
