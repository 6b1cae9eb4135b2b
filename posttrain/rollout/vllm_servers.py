"""Start and stop vLLM servers for a run: `VLLMServers`.

vLLM lives in its own virtual environment (``bash scripts/setup.sh vllm`` makes ``.venv-vllm``:
vLLM pins a transformers older than posttrain's, so the two cannot share one). A run that asks for
``rollout.vllm.launch: N`` starts N servers from that environment with the flags the client needs,
waits for their health checks with a progress line, and stops them at the end, also on Ctrl-C and
on errors (each server is its own process group, killed whole; an ``atexit`` hook covers an
interpreter that exits without unwinding).

The flags, and why:

* ``--logprobs-mode processed_logprobs``: log-probs of the distribution that sampled, after
  temperature and top-k/top-p (vLLM's default is before temperature, which is not the behaviour
  policy the loss divides by);
* ``VLLM_SERVER_DEV_MODE=1``: the routes weight sync uses (``/pause``, ``/collective_rpc``,
  ``/update_weight_version``, ``/resume``, ``/weight_info``);
* ``--enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` when the policy trains a LoRA
  adapter, so that only the adapter is sent at each sync;
* ``--host 127.0.0.1`` unless told otherwise (``::1`` binds IPv6 loopback), and
  ``VLLM_API_KEY=$POSTTRAIN_API_KEY`` in the server's environment whenever that is set (required
  when the bind is not loopback): in its argv any local user would read it from ``ps``.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from posttrain.config import ConfigValueError
from posttrain.errors import UserError
from posttrain.rollout.http import API_KEY_ENV, auth_headers

DEFAULT_ENV = Path(__file__).resolve().parents[2] / ".venv-vllm"


@dataclass(kw_only=True)
class VLLMConfig:
    """``rollout.vllm``: the vLLM servers of ``rollout.backend: vllm`` (docs/vllm.md)."""

    launch: int = 0
    """Servers this run starts (and stops) itself; 0: use the running servers at ``rollout.urls``."""
    python: str = ""
    """The vLLM environment's interpreter; empty: ``$POSTTRAIN_VLLM_PYTHON``, else ``.venv-vllm``."""
    host: str = "127.0.0.1"
    """Address the launched servers bind (IPv4 or IPv6, e.g. ``::1``); anything but loopback needs
    ``$POSTTRAIN_API_KEY`` (the servers get it in their environment as ``VLLM_API_KEY``, the client
    sends it; a key never goes in a config file)."""
    dtype: str = "float32"
    """The servers' weight dtype (``--dtype``): float32, bfloat16 or float16."""
    max_model_len: int = 0
    """Longest prompt + completion a server accepts (``--max-model-len``); 0: the model's own
    (``max_position_embeddings`` in its config.json, which vLLM reads). A value past the model's
    positions is refused before any server starts."""
    enforce_eager: bool = True
    """Skip CUDA-graph capture and compilation (``--enforce-eager``): the faster start, and what a
    CPU build runs anyway; false on a GPU for faster decoding once started."""
    kv_cache_gib: int = 1
    """KV-cache size of a CPU build (``VLLM_CPU_KVCACHE_SPACE``); GPUs size it by memory use."""
    gpus: list[str] = field(default_factory=list)
    """``CUDA_VISIBLE_DEVICES`` of each launched server, in turn (empty: inherit)."""
    extra_args: list[str] = field(default_factory=list)
    """More ``api_server`` flags, e.g. [--gpu-memory-utilization, "0.5"]."""
    startup_timeout_s: float = 600.0
    """Longest wait for launched servers to answer their health check."""
    probe_tol: float = 1e-4
    """Largest difference allowed between a server's and the trainer's log-probs of the probe
    sequence after a sync (fp32 on both sides agrees to ~1e-6; bf16 servers need ~0.05)."""
    sleep_during_update: bool = False
    """Servers that share the trainer's GPU sleep while it computes (``POST /sleep?level=1``: their
    weights go to host memory, their KV cache is freed) and wake before the weight sync
    (``/wake_up``). Launched servers get ``--enable-sleep-mode``. vLLM's sleep mode needs CUDA or
    ROCm; sync mode only (asleep, a server generates nothing, which is all async overlaps)."""

    def __post_init__(self):
        if self.launch < 0:
            raise ConfigValueError("launch", "must be >= 0 (0: use rollout.urls)")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigValueError("dtype", "must be float32, bfloat16 or float16")
        if self.max_model_len < 0:
            raise ConfigValueError("max_model_len", "must be >= 0 (0: the model's own)")
        if self.kv_cache_gib < 1:
            raise ConfigValueError("kv_cache_gib", "must be >= 1")
        if self.sleep_during_update and self.launch and not self.gpus:
            raise ConfigValueError("sleep_during_update", "vLLM's sleep mode needs GPUs: list the servers' "
                                   "gpus (it is not available on CPU builds)")
        if self.startup_timeout_s <= 0 or not self.probe_tol > 0:
            raise ConfigValueError("startup_timeout_s" if self.startup_timeout_s <= 0 else "probe_tol", "must be > 0")


LOOPBACK = ("127.0.0.1", "localhost", "::1")

_ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b: .*")
"""An exception's last line (``RuntimeError: CPU Generator does not use offset``), wherever in a
prefixed log line (``(Worker pid=1) ERROR 12-05 02:43:48 [file.py:1063] ...``) it sits."""


@dataclass(kw_only=True)
class ServerSpec(VLLMConfig):
    """One launch: the config plus what the run knows (the model folder, the adapter rank)."""

    model: str
    lora_rank: int = 0
    """> 0: start with ``--enable-lora --max-lora-rank``; 0: no adapters."""
    max_loras: int = 1
    """With ``lora_rank`` > 0: ``--max-loras``, the adapters the server holds ready at once."""


def vllm_python(spec: ServerSpec) -> str:
    """The interpreter that has vLLM, or a one-line `UserError` saying how to make one."""
    path = spec.python or os.environ.get("POSTTRAIN_VLLM_PYTHON") or str(DEFAULT_ENV / "bin" / "python")
    if not Path(path).is_file():
        raise UserError(f"rollout.vllm.python: no vLLM environment at {path} (make one with "
                        f"`bash scripts/setup.sh vllm`, or point rollout.vllm.python at its interpreter)")
    return path


def model_positions(model: str) -> int | None:
    """The positions the model was built for (``max_position_embeddings``), None when its config
    cannot be read here (a hub id without a cache: vLLM then checks on its own)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError):
        return None
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    n = getattr(config, "max_position_embeddings", None)
    return n if isinstance(n, int) and n > 0 else None


def check_max_model_len(spec: ServerSpec) -> None:
    """A one-line `UserError` when ``max_model_len`` is past the model's positions (vLLM would fail
    to start with a traceback in its log)."""
    n = model_positions(spec.model) if spec.max_model_len else None
    if n is not None and spec.max_model_len > n:
        raise UserError(f"rollout.vllm.max_model_len: {spec.max_model_len} is past the {n} positions of the "
                        f"model at {spec.model} (max_position_embeddings in its config.json); set at most {n}, "
                        f"or 0 for the model's own")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host``, asked of a socket of the host's own address family (IPv6 for ``::1``)."""
    family, _, _, _, addr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(addr)
        return s.getsockname()[1]


def server_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"  # an IPv6 literal takes brackets


def server_command(spec: ServerSpec, python: str, port: int) -> list[str]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
           "--host", spec.host, "--port", str(port), "--dtype", spec.dtype, "--logprobs-mode", "processed_logprobs",
           "--disable-log-stats", "--uvicorn-log-level", "warning"]
    if spec.max_model_len:
        cmd += ["--max-model-len", str(spec.max_model_len)]
    if spec.enforce_eager:
        cmd.append("--enforce-eager")
    if spec.sleep_during_update:
        cmd.append("--enable-sleep-mode")
    if spec.lora_rank > 0:
        cmd += ["--enable-lora", "--max-lora-rank", str(spec.lora_rank), "--max-loras", str(spec.max_loras)]
    return cmd + list(spec.extra_args)  # the API key goes in the environment (`server_env`), never here


def server_env(spec: ServerSpec, index: int) -> dict[str, str]:
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib)}
    # vLLM's api_server checks VLLM_API_KEY, where `ps` cannot show it; only the key the client sends
    env.pop("VLLM_API_KEY", None)
    if os.environ.get(API_KEY_ENV):
        env["VLLM_API_KEY"] = os.environ[API_KEY_ENV]
    if spec.lora_rank > 0:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = spec.gpus[index % len(spec.gpus)]
    return env


class VLLMServers:
    """``n`` vLLM servers of ``spec``; a context manager: ``with VLLMServers(spec, 2, log_dir) as urls``."""

    def __init__(self, spec: ServerSpec, n: int, log_dir: str | Path, printer=print):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if spec.host not in LOOPBACK and not os.environ.get(API_KEY_ENV):
            raise UserError(f"rollout.vllm.host: {spec.host} is not loopback; set ${API_KEY_ENV} so that only "
                            f"this run can reach the servers")
        self.spec, self.n, self.printer = spec, n, printer
        self.log_dir = Path(log_dir)
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def __enter__(self) -> list[str]:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> list[str]:
        vllm_python(self.spec)  # no environment: one line before anything is written or started
        check_max_model_len(self.spec)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            for i in range(self.n):
                self.procs.append(self._launch(i, free_port(self.spec.host)))
                self.urls.append(server_url(self.spec.host, self._port(i)))
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return list(self.urls)

    def _port(self, i: int) -> int:
        return int(self.procs[i].args[self.procs[i].args.index("--port") + 1])

    def _launch(self, i: int, port: int) -> subprocess.Popen:
        with open(self.log_path(i), "ab") as log:
            return subprocess.Popen(server_command(self.spec, vllm_python(self.spec), port),
                                    env=server_env(self.spec, i), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def restart(self, i: int) -> None:
        """Start server ``i`` again on its port (after it died) and wait until it is healthy; it
        holds the model's starting weights until it is sent the current ones."""
        self.kill(i)
        self.printer(f"[vllm] relaunching server {i} ({self.urls[i]})")
        self.procs[i] = self._launch(i, self._port(i))
        self.wait_ready([i])

    def wait_ready(self, indices: list[int] | None = None) -> None:
        """Block until servers ``indices`` (default: all) answer ``/health``; a server that exits
        raises with its log's tail."""
        every = range(self.n) if indices is None else indices
        t0, last, pending = time.monotonic(), 0.0, set(every)
        with httpx.Client(timeout=5.0, headers=auth_headers(None)) as client:
            while pending:
                for i in sorted(pending):
                    if self.procs[i].poll() is not None:
                        raise RuntimeError(f"vLLM server {i} ({self.urls[i]}) exited with status "
                                           f"{self.procs[i].returncode} while starting: {self.log_tail(i)}")
                    try:
                        if client.get(f"{self.urls[i]}/health").status_code == 200:
                            pending.discard(i)
                    except httpx.HTTPError:
                        pass
                waited = time.monotonic() - t0
                if pending and waited > self.spec.startup_timeout_s:
                    raise TimeoutError(f"vLLM servers {sorted(pending)} not healthy after {waited:.0f} s "
                                       f"(rollout.vllm.startup_timeout_s); logs in {self.log_dir}")
                if waited - last >= 10 or not pending:
                    last = waited
                    self.printer(f"[vllm] {len(every) - len(pending)}/{len(every)} servers ready ({waited:.0f} s)")
                if pending:
                    time.sleep(1.0)

    def log_tail(self, i: int, lines: int = 5) -> str:
        try:
            text = self.log_path(i).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text[-lines:])

    def log_path(self, i: int) -> Path:
        return self.log_dir / f"vllm-{i}.log"

    def last_errors(self, i: int, lines: int = 3) -> str:
        """Where server ``i`` logs and the last distinct error lines there (``RuntimeError: ...``),
        without vLLM's line prefixes: why it died, where a user finds the rest. A dying engine logs
        thousands of lines (a traceback per request), so its tail alone repeats one error."""
        try:
            with open(self.log_path(i), "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - (4 << 20)))
                text = f.read().decode(errors="replace").splitlines()
        except OSError:
            return f"no log at {self.log_path(i)}"
        errors = [m.group(0).strip() for line in text if (" ERROR " in line or _ERROR_LINE.match(line))
                  and (m := _ERROR_LINE.search(line))]
        distinct = list(dict.fromkeys(reversed(errors)))[:lines]  # by last appearance
        said = " | ".join(reversed(distinct)) if distinct else "no error line"
        return f"log {self.log_path(i)}: {' '.join(said.split())[:600]}"

    def kill(self, i: int) -> None:
        """SIGKILL server ``i``'s whole process group (its engine core and workers too)."""
        p = self.procs[i]
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every server, SIGKILL what is left after ``grace_s``."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for i, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(i)
        atexit.unregister(self.stop)
