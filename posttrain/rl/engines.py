"""Which rollout engine an RL run samples with, by ``rollout.backend``, ``runtime`` and ``mode``:
the in-process `TorchEngine`, a client of OpenAI-compatible servers (``posttrain serve``, vLLM,
SGLang; vLLM servers launched by the run when asked), or engine replicas on Ray."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from posttrain.core.dist import World
from posttrain.errors import UserError
from posttrain.models.hf import lora_adapter_config, model_folder
from posttrain.rl.config import RLConfig
from posttrain.rollout import HTTPEngine, RolloutEngine, TorchEngine
from posttrain.rollout.http import model_eos_ids


def build_engine(cfg: RLConfig, tokenizer, world: World) -> RolloutEngine | None:
    """Rank 0's rollout engine, by ``rollout.backend``: the in-process `TorchEngine`, or a client of
    OpenAI-compatible servers that receives new weights through ``rollout.weights_dir``. None on
    the other ranks and in async mode (its engine runs in its own process, started by run_async)."""
    if cfg.mode != "sync" or not (world.main or colocates(cfg, world)):
        return None
    if cfg.runtime == "ray":
        return ray_engines(cfg)
    r = cfg.rollout
    if r.backend != "torch":
        return http_engine(cfg, tokenizer)
    return TorchEngine(model_folder(cfg.model.path), tokenizer=tokenizer, device=str(world.device),
                       dtype=getattr(torch, r.engine_dtype))


def colocates(cfg: RLConfig, world: World) -> bool:
    """Whether every rank generates its own groups with its own engine (``rollout.colocate``):
    under torchrun, sync, with the in-process engine; environments generate on rank 0."""
    r = cfg.rollout
    return (world.distributed and cfg.mode == "sync" and r.colocate and r.backend == "torch"
            and cfg.runtime == "local" and not cfg.env.name)


def server_dialect(cfg: RLConfig):
    from posttrain.rollout.http import PosttrainDialect
    from posttrain.rollout.sglang import SGLangDialect
    from posttrain.rollout.vllm import VLLMDialect

    if cfg.rollout.backend == "sglang":
        return SGLangDialect(cfg.rollout.vllm.probe_tol)
    if cfg.rollout.backend != "vllm":
        return PosttrainDialect()
    return VLLMDialect(cfg.rollout.vllm.probe_tol, lora_name=ADAPTER_NAME if cfg.model.lora.enabled else None)


ADAPTER_NAME = "policy"
"""The name vLLM serves the trained LoRA adapter under."""


def http_engine(cfg: RLConfig, tokenizer, printer=print) -> HTTPEngine:
    """A client of the servers at ``rollout.urls``, or of vLLM servers it launches first
    (``rollout.vllm.launch``; they stop when the engine closes)."""
    from posttrain.rollout.vllm_servers import ServerSpec, VLLMServers

    r, path = cfg.rollout, model_folder(cfg.model.path)
    servers, urls = None, r.urls
    adapter_only = r.backend == "vllm" and cfg.model.lora.enabled  # vLLM loads the adapter itself
    if r.backend == "vllm" and r.vllm.launch:
        model = str(Path(path).resolve()) if Path(path).exists() else path
        spec = ServerSpec(**dataclasses.asdict(r.vllm), model=model,
                          lora_rank=cfg.model.lora.r if cfg.model.lora.enabled else 0)
        servers = VLLMServers(spec, r.vllm.launch, Path(cfg.out_dir) / "vllm_logs", printer=printer)
        urls = servers.start()
    try:
        engine = HTTPEngine(urls, weights_dir=r.weights_dir or str(Path(cfg.out_dir) / "rollout_weights"),
                            tokenizer=tokenizer, eos_ids=model_eos_ids(path, tokenizer),
                            model_files=path if Path(path).is_dir() else None, request_timeout_s=r.request_timeout_s,
                            sync_timeout_s=r.sync_timeout_s, retries=r.retries, retry_backoff_s=r.retry_backoff_s,
                            dialect=server_dialect(cfg), servers=servers,
                            adapter_config=lora_adapter_config(cfg.model, path) if adapter_only else None,
                            max_relaunches=cfg.asynchrony.max_engine_restarts, printer=printer)
    except BaseException:
        if servers is not None:
            servers.stop()
        raise
    return engine


def ray_engines(cfg: RLConfig, printer=print):
    """``rollout.replicas`` engine actors on the Ray cluster of ``cfg.ray`` (docs/ray.md)."""
    from posttrain.distributed.cluster import connect, shortfall
    from posttrain.distributed.engines import RayEngines, ReplicaSpec

    ray = connect(cfg.ray.address, cfg.ray.num_cpus or None)
    r, path = cfg.rollout, model_folder(cfg.model.path)
    if not cfg.ray.address and (short := shortfall(ray, r.replicas, r.replica_cpus, r.replica_gpus)):
        raise UserError(f"rollout.replicas: {short} (set ray.num_cpus, or join a cluster with ray.address)")
    spec = ReplicaSpec(path=str(Path(path).resolve()) if Path(path).exists() else path, dtype=r.engine_dtype,
                       cpus=r.replica_cpus, gpus=r.replica_gpus)
    return RayEngines(spec, r.replicas, request_timeout_s=r.request_timeout_s, sync_timeout_s=r.sync_timeout_s,
                      max_restarts=cfg.asynchrony.max_engine_restarts, printer=printer,
                      host=ray.util.get_node_ip_address() if cfg.ray.address else "127.0.0.1",
                      stream_weights=r.ray_weights == "stream" or r.ray_weights == "auto" and cfg.mode == "sync")
