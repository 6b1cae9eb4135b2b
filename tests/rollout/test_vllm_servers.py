"""Launching vLLM servers without vLLM: what a server's process is given (argv, environment), and
the start-up path over IPv6 loopback with a stand-in server that answers ``/health``."""

from __future__ import annotations

import socket
import sys

import pytest

from posttrain.rollout import vllm_servers
from posttrain.rollout.http import API_KEY_ENV
from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers, server_command, server_env

# argv: -c HOST DIR --port PORT (`VLLMServers` reads the port back from "--port")
STAND_IN = ("import runpy, sys; sys.argv = ['http.server', '--bind', sys.argv[1], '--directory', sys.argv[2], "
            "sys.argv[4]]; runpy.run_module('http.server', run_name='__main__')")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_the_api_key_reaches_a_server_in_its_environment_not_its_command_line(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "key-that-ps-must-not-show")
    spec = ServerSpec(model="/models/tiny", host="0.0.0.0")
    argv = server_command(spec, "python", 8000)
    assert "--api-key" not in argv and not any("key-that-ps" in a for a in argv)
    assert server_env(spec, 0)["VLLM_API_KEY"] == "key-that-ps-must-not-show"


def test_a_server_checks_no_key_the_client_does_not_send(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "left-over-from-the-shell")
    assert "VLLM_API_KEY" not in server_env(ServerSpec(model="/models/tiny"), 0)


@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_servers_on_ipv6_loopback_start_and_answer_at_a_bracketed_url(monkeypatch, tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "health").write_text("ok")
    monkeypatch.setattr(vllm_servers, "server_command",
                        lambda spec, python, port: [python, "-c", STAND_IN, spec.host, str(tmp_path / "site"),
                                                    "--port", str(port)])
    spec = ServerSpec(model="/models/tiny", host="::1", python=sys.executable, startup_timeout_s=60)
    with VLLMServers(spec, 1, tmp_path / "logs", printer=lambda *_: None) as urls:
        assert len(urls) == 1 and urls[0].startswith("http://[::1]:")


def test_last_errors_names_the_log_and_the_distinct_errors_of_a_dying_engine(tmp_path):
    """A crashed engine logs a traceback per request: the root cause is far above the tail."""
    servers = VLLMServers(ServerSpec(model="/models/tiny"), 1, tmp_path, printer=lambda *_: None)
    prefix = "(Worker pid=7) ERROR 12-05 02:43:48 [multiproc_executor.py:1063] "
    dead = "(APIServer pid=5) ERROR 12-05 02:43:49 [serving.py:1] EngineDeadError: EngineCore encountered an issue."
    lines = ["(APIServer pid=5) WARNING [system_utils.py:255] failed: `OSError: [Errno 24] Too many open files`.",
             prefix + "Traceback (most recent call last):", prefix + "    gen.set_offset(gen.get_offset() - 4)",
             prefix + "RuntimeError: CPU Generator does not use offset"] + [dead] * 3000
    servers.log_path(0).write_text("\n".join(lines) + "\n")
    said = servers.last_errors(0)
    assert said == (f"log {servers.log_path(0)}: RuntimeError: CPU Generator does not use offset | "
                    f"EngineDeadError: EngineCore encountered an issue.")
    assert servers.last_errors(1) == f"no log at {tmp_path / 'vllm-1.log'}"


def test_max_model_len_defaults_to_the_models_own_and_a_longer_one_is_one_line_exit_2(nano_model_dir, arith_data_dir,
                                                                                      tmp_path, capsys):
    from transformers import AutoConfig

    from posttrain.cli import main

    positions = AutoConfig.from_pretrained(nano_model_dir).max_position_embeddings
    assert "--max-model-len" not in server_command(ServerSpec(model=str(nano_model_dir)), "python", 8000)
    assert vllm_servers.model_positions(str(nano_model_dir)) == positions
    code = main(["rl", f"model.path={nano_model_dir}", f"data.path={arith_data_dir / 'prompts_train.jsonl'}",
                 "rollout.backend=vllm", "rollout.vllm.launch=1", f"rollout.vllm.python={sys.executable}",
                 f"rollout.vllm.max_model_len={positions + 1}", f"out_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"rollout.vllm.max_model_len: {positions + 1} is past the {positions} positions" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("given,blamed", [([], "command line: rollout.backend"),
                                          (["rollout.urls=[http://127.0.0.1:9]", "rollout.vllm.launch=1"],
                                           "command line: rollout.urls")])
def test_neither_or_both_of_urls_and_launch_names_the_key_the_user_set(tmp_path, capsys, given, blamed):
    """backend=vllm given on the command line, the YAML silent on servers: the line blames the
    command line's key, not the YAML file."""
    from posttrain.cli import main

    yaml = tmp_path / "rl.yaml"
    yaml.write_text("model:\n  path: /models/tiny\ndata:\n  path: /data/prompts.jsonl\n")
    assert main(["rl", str(yaml), "rollout.backend=vllm", *given, f"out_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"posttrain rl: error: {blamed}: backend=vllm: set exactly one of rollout.urls (running servers) "
                   f"or rollout.vllm.launch=N (servers the run starts)"), err
