"""`posttrain serve` as a process: one-line errors with exit 2, the URL when ready, Ctrl-C or SIGTERM stop it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def serve(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "posttrain", "serve", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=ENV, **kwargs)


@pytest.mark.parametrize("case", ["missing", "no_config", "empty_run_dir"])
def test_bad_model_path_is_one_line_exit_2(tmp_path, case):
    path = tmp_path / "nope"
    if case == "no_config":
        path.mkdir()
    elif case == "empty_run_dir":
        (path / "checkpoints").mkdir(parents=True)
    r = serve(path, "--port", 0)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("posttrain serve: error: MODEL=") and str(path) in lines[0]
    assert r.stdout == ""


def test_port_in_use_is_exit_2(nano_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = serve(nano_model_dir, "--port", taken.getsockname()[1])
    assert r.returncode == 2 and "cannot listen" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_serves_then_stops_on_signal(nano_model_dir, tmp_path, sig):
    import httpx

    run = tmp_path / "run"  # a run directory: its newest complete checkpoint is served
    ckpt = run / "checkpoints" / "step-3"
    shutil.copytree(nano_model_dir, ckpt)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    proc = subprocess.Popen([sys.executable, "-m", "posttrain", "serve", str(run), "--port", "0", "--threads", "1",
                             "--served-model-name", "tiny-policy"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)
    try:
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = m.group(1)
        assert httpx.get(f"{url}/health").json() == {"status": "ok", "version": 0}
        assert httpx.get(f"{url}/get_model_info").json()["model_path"] == str(ckpt)
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny-policy", "prompt": [1, 2, 3], "max_tokens": 4},
                       timeout=60)
        assert r.status_code == 200 and len(r.json()["choices"]) == 1
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        err = proc.stderr.read()
        assert rc == 0, err
        assert "posttrain serve: stopped" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the port is released
        try:
            httpx.get(f"{url}/health", timeout=0.5)
        except httpx.TransportError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the server still answers after the signal")


def test_listening_beyond_loopback_needs_an_api_key(nano_model_dir):
    env = {k: v for k, v in ENV.items() if k != "POSTTRAIN_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "posttrain", "serve", str(nano_model_dir), "--host", "0.0.0.0",
                        "--port", "0"], capture_output=True, text=True, timeout=120, env=env)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--host=0.0.0.0" in lines[0] and "API key" in lines[0]
    assert r.stdout == ""


def test_a_weights_root_that_is_not_a_folder_is_one_line_exit_2(nano_model_dir, tmp_path):
    r = serve(nano_model_dir, "--port", "0", "--weights-root", tmp_path / "nope")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--weights-root=" in lines[0] and r.stdout == ""
