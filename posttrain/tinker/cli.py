"""`posttrain tinker-serve --root DIR [--model NAME=PATH ...]`: a Tinker-compatible training API.

The official `tinker` SDK (``ServiceClient(base_url=...)``) and loops written for it train LoRA
adapters here: sessions, create_model, forward / forward_backward with the SDK's loss names,
optim_step, save_weights / save_state / load_state, save_weights_for_sampler, sampling with
log-probs, checkpoint listing. Base models are named on this command line only (a local model
folder each; without --model, the embedded tiny model is built under ROOT/_base); clients pick
one by name and never name a folder. Checkpoints are written under --root. An address beyond
loopback needs an API key (--api-key or $POSTTRAIN_API_KEY), which the SDK sends as
$TINKER_API_KEY (it must start with "tml-"). See docs/tinker.md.

Under ``torchrun --nproc-per-node N -m posttrain tinker-serve ...`` every rank loads the base models
and holds its FSDP2 shard of them; rank 0 serves the API and the other ranks train with it in lock
step (`posttrain.tinker.ranks`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from posttrain.errors import UserError
from posttrain.serve.serve_cli import API_KEY_ENV, is_loopback

TINY = "posttrain/tiny"
IDLE_S = 7 * 24 * 3600.0
"""How long a rank other than 0 waits for rank 0's next request before the process group gives up:
a server may sit idle for days (torchrun still stops every rank when one dies)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("--root", required=True, help="folder checkpoints are written to and read from")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                        help=f"a base model clients may train: NAME as clients send it, PATH a local model folder "
                             f"(repeatable; default: the embedded tiny model as {TINY!r})")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help=f"require this key (X-API-Key or Authorization: Bearer) on every route but "
                             f"/api/v1/healthz (default: ${API_KEY_ENV}); needed beyond loopback")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--max-models", type=int, default=16, help="most training clients at once (default 16)")
    parser.add_argument("--max-context", type=int, default=None,
                        help="longest datum or prompt+sample in tokens (default: the model's positions)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def _models(specs: list[str], root: Path, world=None) -> dict[str, Path]:
    if not specs:
        from posttrain.models.tiny import build_tiny

        folder = root / "_base" / "tiny"
        if (world is None or world.main) and not (folder / "config.json").is_file():
            build_tiny(folder, "tiny", seed=0)
        if world is not None:
            world.barrier()  # the other ranks load what rank 0 built
        return {TINY: folder}
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--model={spec}: expected NAME=PATH")
        if not (Path(path) / "config.json").is_file():
            raise UserError(f"--model={spec}: {path} is not a local model folder (no config.json); nothing is downloaded")
        out[name] = Path(path)
    return out


def load_base(name: str, path: Path, max_context: int | None, world=None):
    """The base model ``name`` at ``path`` and its engine; with a distributed ``world`` the model
    is sharded over its ranks, and only rank 0 has an engine."""
    import torch

    from posttrain.models.hf import ModelConfig, disable_dropout, load_model, load_tokenizer
    from posttrain.rollout.engine import TorchEngine
    from posttrain.tinker.training import Base

    model = load_model(ModelConfig(path=str(path)), trainable=True, key="--model")
    disable_dropout(model)
    tokenizer = load_tokenizer(str(path), key="--model")
    engine = TorchEngine(model, tokenizer=tokenizer, dtype=torch.float32) if world is None or world.main else None
    positions = int(getattr(model.config, "max_position_embeddings", 2048))
    base = Base(name, model, tokenizer, engine, min(max_context or positions, positions))
    if world is not None and world.distributed:
        base.shard(world)
    return base


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port={args.port}: must be in 0..65535")
    if args.max_models < 1:
        raise UserError(f"--max-models={args.max_models}: must be >= 1")
    if not is_loopback(args.host) and not args.api_key:
        raise UserError(f"--host={args.host}: listening beyond loopback needs an API key (--api-key or ${API_KEY_ENV})")
    root = Path(args.root).expanduser()
    if not root.is_dir():
        raise UserError(f"--root={args.root}: not a folder")
    root = root.resolve()
    world = _world()
    models = _models(args.model, root, world)

    import torch
    import uvicorn

    from posttrain.models.hf import quiet_transformers
    from posttrain.serve.serve_cli import _bind, _url
    from posttrain.tinker.app import Limits, create_app

    quiet_transformers()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not world.main:
        from posttrain.tinker.ranks import follow

        follow({name: load_base(name, path, args.max_context, world=world) for name, path in models.items()}, world)
        return 0
    sock = _bind(args.host, args.port)
    bases = {name: load_base(name, path, args.max_context, world=world) for name, path in models.items()}
    app = create_app(bases, root, api_key=args.api_key, limits=Limits(max_models=args.max_models))
    url = _url(sock)
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, timeout_graceful_shutdown=5)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:
                print(f"posttrain tinker-serve: {', '.join(bases)} at {url} - Ctrl-C to stop", flush=True)

    try:
        Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        _stop_ranks(app.state.tinker, world)
    print("posttrain tinker-serve: stopped", file=sys.stderr, flush=True)
    return 0


def _world():
    """torchrun's ranks (gloo on the CPU), or one process."""
    from posttrain.core.dist import World, init_world, launched_by_torchrun

    return init_world("cpu", timeout_s=IDLE_S) if launched_by_torchrun() else World()


def _stop_ranks(state, world) -> None:
    """The server stopped: the work queued is dropped, the running request finished (the worker is
    the only thread that talks to the other ranks), then the other ranks are let go."""
    from posttrain.tinker.ranks import release

    state.worker.shutdown(wait=True, cancel_futures=True)
    release(world)
