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
from posttrain.models.gguf import is_gguf_path
from posttrain.serve.serve_cli import API_KEY_ENV, announcing_server, _bind, set_up_torch, _url, is_loopback

TINY = "posttrain/tiny"
IDLE_S = 7 * 24 * 3600.0
"""How long a rank other than 0 waits for rank 0's next request before giving up: a server may sit
idle for days (torchrun still stops every rank when one dies)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("--root", required=True, help="folder checkpoints are written to and read from")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                        help=f"a base model clients may train: NAME as clients send it, PATH a local model folder "
                             f"or a GGUF file, converted once into the cache (repeatable; default: the embedded tiny "
                             f"model as {TINY!r})")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help=f"require this key (X-API-Key or Authorization: Bearer) on every route but "
                             f"/api/v1/healthz (default: ${API_KEY_ENV}); needed beyond loopback")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--max-models", type=int, default=16, help="most training clients at once (default 16)")
    parser.add_argument("--max-sessions", type=int, default=256,
                        help="most SDK sessions open at once; a new one beyond ends the least recently heard from "
                             "and unloads its training clients (default 256)")
    parser.add_argument("--max-context", type=int, default=None,
                        help="longest datum or prompt+sample in tokens (default: the model's positions)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                        help="the HTTP server's log level (default warning)")
    _add_vllm_arguments(parser)
    _add_ray_arguments(parser)


def _add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    vllm = parser.add_argument_group("sampling on vLLM (--sampler vllm; docs/tinker.md)")
    vllm.add_argument("--sampler", default="torch", choices=["torch", "ray", "vllm"],
                      help="the engine samples come from: the in-process TorchEngine (default), TorchEngine "
                           "replicas as Ray actors, or vLLM servers that take each sampler snapshot as a LoRA "
                           "adapter (the base is never re-sent)")
    vllm.add_argument("--vllm-url", action="append", default=[], metavar="URL",
                      help="a running vLLM server on the same model, started with LoRA on (repeatable)")
    vllm.add_argument("--vllm-launch", action="store_true",
                      help="start one vLLM server from .venv-vllm ($POSTTRAIN_VLLM_PYTHON) and stop it on exit")
    vllm.add_argument("--vllm-max-lora-rank", type=int, default=32,
                      help="the launched server's --max-lora-rank: the largest client rank it samples (default 32)")
    vllm.add_argument("--vllm-max-loras", type=int, default=4,
                      help="the launched server's --max-loras: snapshots kept loaded at once, the least recently "
                           "used one replaced (default 4; running servers: their own --max-loras)")
    vllm.add_argument("--vllm-probe-tol", type=float, default=1e-4,
                      help="largest probe log-prob difference server vs trainer after a push (default 1e-4; "
                           "fp32 on both sides)")


def _add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    ray = parser.add_argument_group("sampling on Ray engine replicas (--sampler ray; docs/tinker.md, docs/ray.md)")
    ray.add_argument("--ray-address", default="",
                     help="the Ray cluster to join: auto (the one this machine joined with ray start) or host:port; "
                          "default: start a local Ray")
    ray.add_argument("--ray-num-cpus", type=int, default=0,
                     help="CPUs of the local Ray started without --ray-address (default: this machine's cores)")
    ray.add_argument("--ray-replicas", type=int, default=1, help="engine replicas (Ray actors; default 1)")
    ray.add_argument("--ray-replica-cpus", type=float, default=1.0,
                     help="CPUs each replica reserves, also its torch thread count (default 1)")
    ray.add_argument("--ray-replica-gpus", type=float, default=0.0,
                     help="GPUs each replica reserves; > 0 puts its engine on cuda (default 0)")


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
        if is_gguf_path(path):
            path = _converted(path, f"--model={name}", world)
        if not (Path(path) / "config.json").is_file():
            raise UserError(f"--model={spec}: {path} is not a local model folder (no config.json); nothing is downloaded")
        out[name] = Path(path)
    return out


def _converted(path: str, key: str, world) -> str:
    """A GGUF file's converted folder, as every command reads one (`posttrain.models.gguf`): rank 0
    converts it on first use, the other ranks then find it in the cache."""
    from posttrain.models.hf import model_folder

    if world is None or world.main:
        model_folder(path, key)
    if world is not None:
        world.barrier()
    return model_folder(path, key)


def load_base(name: str, path: Path, max_context: int | None, sampler=None, orders=None):
    """The base model ``name`` at ``path`` and its sampling engine: an in-process `TorchEngine`, or
    what ``sampler`` (a function of the tokenizer, `vllm_sampling` or `ray_sampling`) makes. With a
    distributed world (``orders``, `posttrain.tinker.ranks.Orders`) the model is sharded over its
    ranks, and only rank 0 has an engine."""
    import torch

    from posttrain.models.hf import ModelConfig, disable_dropout, load_model, load_tokenizer
    from posttrain.tinker.samplers import TorchSampling
    from posttrain.tinker.training import Base

    model = load_model(ModelConfig(path=str(path)), trainable=True, key="--model")
    disable_dropout(model)
    tokenizer = load_tokenizer(str(path), key="--model")
    world = orders.world if orders is not None else None
    if world is not None and not world.main:
        sampling = None
    elif sampler is None:
        from posttrain.rollout.engine import TorchEngine

        sampling = TorchSampling(TorchEngine(model, tokenizer=tokenizer, dtype=torch.float32))
    else:
        sampling = sampler(tokenizer)
    positions = int(getattr(model.config, "max_position_embeddings", 2048))
    base = Base(name, model, tokenizer, sampling, min(max_context or positions, positions), path=str(path))
    if world is not None and world.distributed:
        base.shard(world, orders)
    if sampling is None:
        return base
    try:
        base.use_snapshot("base", None)  # vLLM: its probe proves the servers serve this model; Ray: the base pushed
    except RuntimeError as e:
        sampling.close()
        raise UserError(f"--model={path}: {e}") from None
    return base


def check_vllm_flags(args: argparse.Namespace) -> None:
    """The --vllm-* flags, before anything is written or started."""
    if args.sampler != "vllm":
        if args.vllm_url or args.vllm_launch:
            raise UserError("--vllm-url/--vllm-launch: only with --sampler vllm")
        return
    if bool(args.vllm_url) == bool(args.vllm_launch):
        raise UserError("--sampler=vllm: give the servers (--vllm-url URL) or --vllm-launch, one of the two")
    if not 1 <= args.vllm_max_lora_rank <= 256:
        raise UserError(f"--vllm-max-lora-rank={args.vllm_max_lora_rank}: must be in 1..256")
    if not 1 <= args.vllm_max_loras <= 64:
        raise UserError(f"--vllm-max-loras={args.vllm_max_loras}: must be in 1..64")
    if not args.vllm_probe_tol > 0:
        raise UserError(f"--vllm-probe-tol={args.vllm_probe_tol}: must be > 0")


def check_ray_flags(args: argparse.Namespace) -> None:
    """The --ray-* flags, before anything is written or started."""
    if args.sampler != "ray":
        return
    if args.ray_replicas < 1:
        raise UserError(f"--ray-replicas={args.ray_replicas}: must be >= 1")
    if args.ray_num_cpus < 0:
        raise UserError(f"--ray-num-cpus={args.ray_num_cpus}: must be >= 0")
    if not args.ray_replica_cpus > 0 or args.ray_replica_gpus < 0:
        raise UserError("--ray-replica-cpus must be > 0 and --ray-replica-gpus >= 0")


def ray_sampling(args: argparse.Namespace, path: Path):
    """A maker of the `RaySampling` of --ray-*: its replicas start (and Ray with them, unless
    --ray-address names a cluster) only when it is called."""

    def make(tokenizer):
        from posttrain.distributed.cluster import connect, shortfall
        from posttrain.distributed.engines import RayEngines, ReplicaSpec
        from posttrain.tinker.samplers import RaySampling

        ray = connect(args.ray_address, args.ray_num_cpus or None)
        if not args.ray_address and (short := shortfall(ray, args.ray_replicas, args.ray_replica_cpus,
                                                         args.ray_replica_gpus)):
            raise UserError(f"--ray-replicas: {short} (set --ray-num-cpus, or join a cluster with --ray-address)")
        spec = ReplicaSpec(path=str(path.resolve()), cpus=args.ray_replica_cpus, gpus=args.ray_replica_gpus)
        host = ray.util.get_node_ip_address() if args.ray_address else "127.0.0.1"
        return RaySampling(RayEngines(spec, args.ray_replicas, host=host,
                                      printer=lambda m: print(m, file=sys.stderr, flush=True)))

    return make


def vllm_sampling(args: argparse.Namespace, path: Path, root: Path):
    """A maker of the `VLLMSampling` of --vllm-url / --vllm-launch (the launched server is started
    only when it is called, and stopped when the sampler closes)."""

    def make(tokenizer):
        from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers
        from posttrain.tinker.samplers import VLLMSampling

        servers, urls = None, args.vllm_url
        if args.vllm_launch:
            spec = ServerSpec(model=str(path.resolve()), lora_rank=args.vllm_max_lora_rank, max_loras=args.vllm_max_loras,
                              max_model_len=args.max_context or 0)
            servers = VLLMServers(spec, 1, root / "_vllm" / "logs", printer=lambda m: print(m, file=sys.stderr))
            urls = servers.start()
        try:
            return VLLMSampling(urls, model_path=str(path), tokenizer=tokenizer, weights_dir=root / "_vllm" / "adapters",
                                servers=servers, probe_tol=args.vllm_probe_tol)
        except BaseException:
            if servers is not None:
                servers.stop()
            raise

    return make


def run(args: argparse.Namespace) -> int:
    root = check_arguments(args)
    orders = _ranks()
    models = _models(args.model, root, orders.world)
    sampler = _sampler(args, models, root)
    set_up_torch(args.threads)
    if not orders.world.main:
        _follow(args, models, orders)
        return 0
    sock = _bind(args.host, args.port)
    bases = _load_bases(args, models, sampler, orders, sock)
    _serve(_app(args, bases, root), sock, bases, orders, args.log_level)
    print("posttrain tinker-serve: stopped", file=sys.stderr, flush=True)
    return 0


def check_arguments(args: argparse.Namespace) -> Path:
    """The flags, before anything is written, loaded or started; the checkpoint root, resolved."""
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port={args.port}: must be in 0..65535")
    if args.max_models < 1:
        raise UserError(f"--max-models={args.max_models}: must be >= 1")
    if args.max_sessions < 1:
        raise UserError(f"--max-sessions={args.max_sessions}: must be >= 1")
    if not is_loopback(args.host) and not args.api_key:
        raise UserError(f"--host={args.host}: listening beyond loopback needs an API key (--api-key or ${API_KEY_ENV})")
    root = Path(args.root).expanduser()
    if not root.is_dir():
        raise UserError(f"--root={args.root}: not a folder")
    check_vllm_flags(args)
    check_ray_flags(args)
    return root.resolve()


def _sampler(args: argparse.Namespace, models: dict[str, Path], root: Path):
    """The maker of --sampler's engine, or None for the in-process TorchEngine. vLLM servers and
    Ray replicas hold one base model, so they serve only one --model."""
    if args.sampler == "vllm":
        if len(models) != 1:
            raise UserError("--sampler=vllm: one --model only (a vLLM server serves one base model)")
        return vllm_sampling(args, next(iter(models.values())), root)
    if args.sampler == "ray":
        if len(models) != 1:
            raise UserError("--sampler=ray: one --model only (the replicas hold one base model)")
        return ray_sampling(args, next(iter(models.values())))
    return None


def _follow(args: argparse.Namespace, models: dict[str, Path], orders) -> None:
    """A rank other than 0: its shard of each base model, trained as rank 0 orders until released."""
    from posttrain.tinker.ranks import follow

    follow({name: load_base(name, path, args.max_context, orders=orders) for name, path in models.items()}, orders)


def _load_bases(args: argparse.Namespace, models: dict[str, Path], sampler, orders, sock) -> dict:
    """Rank 0's base models with their samplers; the socket, bound already, closed if one fails."""
    try:
        return {name: load_base(name, path, args.max_context, sampler, orders) for name, path in models.items()}
    except BaseException:
        sock.close()
        raise


def _app(args: argparse.Namespace, bases: dict, root: Path):
    from posttrain.tinker.app import Limits, create_app

    limits = Limits(max_models=args.max_models, max_sessions=args.max_sessions)
    return create_app(bases, root, api_key=args.api_key, limits=limits)


def _serve(app, sock, bases: dict, orders, log_level: str) -> None:
    """Serves ``app`` on ``sock`` until Ctrl-C; then the socket is closed, the other ranks let go
    and the samplers closed."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5)
    banner = f"posttrain tinker-serve: {', '.join(bases)} at {_url(sock)} - Ctrl-C to stop"
    try:
        announcing_server(config, banner).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        _stop_ranks(app.state.tinker, orders)
        for base in bases.values():
            base.sampling.close()


def _ranks():
    """torchrun's ranks (gloo on the CPU) or one process, and the channel rank 0 sends them work on."""
    from posttrain.core.dist import World, init_world, launched_by_torchrun
    from posttrain.tinker.ranks import Orders

    return Orders(init_world("cpu") if launched_by_torchrun() else World(), IDLE_S)


def _stop_ranks(state, orders) -> None:
    """The server stopped: the work queued is dropped, the running request finished (the worker is
    the only thread that talks to the other ranks), then the other ranks are let go."""
    from posttrain.tinker.ranks import release

    state.worker.shutdown(wait=True, cancel_futures=True)
    release(orders)
