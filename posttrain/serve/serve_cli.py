"""`posttrain serve MODEL_OR_RUN_DIR [--port P] [--host H]`: the rollout engine behind an OpenAI-compatible API.

MODEL_OR_RUN_DIR is a model folder (config.json + safetensors + tokenizer), a hub id, or a run
directory, which means its newest complete checkpoints/step-N. The server prints its URL once it
listens; Ctrl-C stops it. Routes: /health, /v1/models, /v1/completions, /v1/chat/completions,
/update_weights_from_disk, /get_model_info. With an API key (--api-key or $POSTTRAIN_API_KEY) every
route but /health needs it; an address beyond loopback needs one. Weight reloads read folders under
--weights-root only. See docs/serve.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys

from posttrain.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("model", metavar="MODEL_OR_RUN_DIR", help="model folder, hub id, or run directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id clients send and /v1/models lists (default: the path as given)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the engine's weights (default float32)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto (default cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--max-batch-prompts", type=int, default=256,
                        help="most prompts batched into one engine call (default 256)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0,
                        help="how long the batcher waits for one more request before starting (default 5)")
    parser.add_argument("--batch-seeded", action="store_true",
                        help="batch seeded sampled requests together (faster; a seed then reproduces only the same "
                             "batch, not TorchEngine on the request alone)")
    parser.add_argument("--max-samples-per-request", type=int, default=4096,
                        help="largest prompts x n one request may ask for (default 4096)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV}); "
                             f"needed to listen beyond loopback")
    parser.add_argument("--weights-root", default=None,
                        help="the folder weight reloads may read from (/update_weights_from_disk); without it "
                             "reloads are refused")
    parser.add_argument("--allow-version-rollback", action="store_true",
                        help="accept a reload whose version is older than the loaded one, or the loaded one "
                             "for other weights (a new trainer run against a server that served a previous one)")
    parser.add_argument("--allow-partial-weights", action="store_true",
                        help="accept a reload that carries only some of the model's weights")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                        help="server log level (default warning)")


API_KEY_ENV = "POSTTRAIN_API_KEY"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to who knows what
        return False


class _Stopped(Exception):
    """SIGTERM, after uvicorn's graceful shutdown."""


def _raise_stopped(signum, frame):
    raise _Stopped()


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host={host}: cannot resolve ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: uvicorn writes a response's head and body apart, and under
    # Nagle the body waited for the client's delayed ACK, 40 ms a request on loopback (measured).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise UserError(f"--host={host} --port={port}: cannot listen there ({e.strerror})") from None
    sock.set_inheritable(True)
    return sock


def _weights_root(path: str | None):
    from pathlib import Path

    if path is None:
        return None
    root = Path(path).expanduser()
    if not root.is_dir():
        raise UserError(f"--weights-root={path}: not a folder")
    return root.resolve()


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    weights_root = _weights_root(args.weights_root)
    path = _model_path(args.model)
    sock = _bind(args.host, args.port)
    set_up_torch(args.threads)

    from posttrain.serve.app import load_engine

    engine, tokenizer, checksum = load_engine(path, dtype=args.dtype, device=args.device)
    name = args.served_model_name or args.model
    app = _app(args, name, engine, tokenizer, checksum, path, weights_root)
    _serve(app, sock, args.log_level, f"posttrain serve: {name} ({path}, {args.dtype} on {engine.device}) at "
                                      f"{_url(sock)}/v1 - Ctrl-C to stop")
    print("posttrain serve: stopped", file=sys.stderr, flush=True)
    return 0


def check_arguments(args: argparse.Namespace) -> None:
    """The flags, before anything is read, bound or loaded."""
    if args.port < 0 or args.port > 65535:
        raise UserError(f"--port={args.port}: must be in 0..65535")
    for name in ("max_batch_prompts", "max_samples_per_request"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads={args.threads}: must be >= 1")
    if args.batch_wait_ms < 0:
        raise UserError(f"--batch-wait-ms={args.batch_wait_ms}: must be >= 0")
    if not is_loopback(args.host) and not args.api_key:
        raise UserError(f"--host={args.host}: listening beyond loopback needs an API key (--api-key or "
                        f"${API_KEY_ENV}): anyone who reaches the port could otherwise replace the weights")


def _model_path(model: str):
    """MODEL_OR_RUN_DIR as the model folder it means, checked before anything binds or loads."""
    from posttrain.models.hf import check_model_path
    from posttrain.serve.weights import resolve_model_dir

    path = resolve_model_dir(model)
    check_model_path(str(path), "MODEL")
    return path


def set_up_torch(threads: int | None) -> None:
    import torch

    from posttrain.models.hf import quiet_transformers

    quiet_transformers()
    if threads:
        torch.set_num_threads(threads)


def _app(args: argparse.Namespace, name: str, engine, tokenizer, checksum: str | None, path, weights_root):
    from posttrain.serve.app import Access, create_app

    access = Access(api_key=args.api_key, weights_root=weights_root, allow_version_rollback=args.allow_version_rollback,
                    allow_partial_weights=args.allow_partial_weights)
    return create_app(engine, tokenizer, served_model_name=name, model_path=path, checksum=checksum,
                      max_batch_prompts=args.max_batch_prompts, batch_wait_ms=args.batch_wait_ms,
                      batch_seeded=args.batch_seeded, max_samples_per_request=args.max_samples_per_request,
                      access=access)


def announcing_server(config, banner: str):
    """A uvicorn server that prints ``banner`` once it listens (the line clients wait for)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:
                print(banner, flush=True)

    return Server(config)


def _serve(app, sock: socket.socket, log_level: str, banner: str) -> None:
    """Serves ``app`` on ``sock`` until Ctrl-C or SIGTERM, then closes the socket."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5, lifespan="on")
    server = announcing_server(config, banner)
    # uvicorn catches SIGINT/SIGTERM, shuts down gracefully, restores the handlers it found and
    # re-raises the signal: SIGINT comes back as KeyboardInterrupt, SIGTERM as _Stopped from here.
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        server.run(sockets=[sock])
    except (KeyboardInterrupt, _Stopped):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        sock.close()
