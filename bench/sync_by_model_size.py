"""Seconds per weight version by model size and by where the engine lives, side by side in one run.

For each model (nano, tiny, small from `posttrain make-tiny`, and a ~100M-parameter Llama built
here with random weights), one new version of the full weights goes to:

- ``in-process``: `TorchEngine.load_weights` (the laptop layout, and every colocated rank);
- ``http``: `HTTPEngine.load_weights` to a ``posttrain serve`` app on loopback — write the
  safetensors, the server loads them, checks and echoes the checksum (the layout of servers apart,
  vLLM's reload included in spirit; vLLM's own figures are bench/vllm_vs_torch.py's);
- ``ray``: `RayEngines.load_weights` to one engine replica through the object store, waited for
  until the replica acknowledged the checksum (with ``--ray``; starts a local Ray);
- ``ray-stream``: `RayEngines.load_buckets` to one replica over the weight group (gloo), in
  buckets of ``--bucket-mb`` (sync mode's default), until it acknowledged the checksum.

Prints seconds per version (median of ``--repeats``), MiB moved, and MiB/s, and each layout's
time relative to in-process.

    .venv/bin/python bench/sync_by_model_size.py                 # nano, tiny, small, 100m
    .venv/bin/python bench/sync_by_model_size.py --ray --sizes nano tiny
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def build_100m(out: Path) -> Path:
    """A ~100M-parameter Llama (hidden 768, 12 layers) with the embedded tokenizer, random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.models.tiny import build_tiny

    tiny = build_tiny(out / "tok", "nano", seed=0)  # for its tokenizer
    from posttrain.models.hf import load_tokenizer

    tok = load_tokenizer(str(tiny))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=768, intermediate_size=2560, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    path = out / "100m"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def buckets(weights: dict, mib: float):
    """The weights in consecutive buckets of about ``mib`` MiB (as `export_buckets` cuts them)."""
    bucket, size = {}, 0
    for name, t in weights.items():
        bucket[name] = t
        size += t.numel() * t.element_size()
        if size >= mib * 2**20:
            yield bucket
            bucket, size = {}, 0
    if bucket:
        yield bucket


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["nano", "tiny", "small", "100m"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ray", action="store_true", help="also push to a Ray engine replica (starts a local Ray)")
    ap.add_argument("--bucket-mb", type=float, default=64.0, help="bucket size of the streamed Ray push (MiB)")
    args = ap.parse_args()

    import torch

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny
    from posttrain.rollout import HTTPEngine, TorchEngine, weights_checksum
    from posttrain.rollout.http import model_eos_ids

    quiet_transformers()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="sync-bench-"))
    ray_engines = None
    if args.ray:
        from posttrain.distributed.cluster import connect

        connect("", num_cpus=4)
    rows = []
    for size in args.sizes:
        path = build_100m(root) if size == "100m" else build_tiny(root / size, size, seed=0)
        local = TorchEngine(str(path))
        weights = {k: v.detach().clone() for k, v in local.model.state_dict().items()}
        checksum = weights_checksum(weights)
        mib = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
        params = sum(t.numel() for t in weights.values())
        version = iter(range(1, 10_000))
        row = {"size": size, "params": params, "mib": mib,
               "in-process": timed(lambda: local.load_weights(weights, next(version), checksum), args.repeats)}
        server = _serve(path)
        try:
            client = HTTPEngine([server.url], weights_dir=str(root / f"w-{size}"), tokenizer=local.tokenizer,
                                eos_ids=model_eos_ids(str(path), local.tokenizer), model_files=str(path))
            row["http"] = timed(lambda: client.load_weights(weights, next(version), checksum), args.repeats)
            client.close()
        finally:
            server.stop()
        if args.ray:
            from posttrain.distributed.engines import RayEngines, ReplicaSpec

            ray_engines = RayEngines(ReplicaSpec(path=str(path), dtype="float32", cpus=1, gpus=0), 1)

            def push():
                ray_engines.load_weights(weights, next(version), checksum)
                ray_engines.wait_synced()

            row["ray"] = timed(push, args.repeats)

            def stream():
                ray_engines.load_buckets(buckets(weights, args.bucket_mb), next(version), lambda: checksum)

            row["ray-stream"] = timed(stream, args.repeats)
            ray_engines.close()
        rows.append(row)
        print(f"  {size}: done", flush=True)
    layouts = ["in-process", "http"] + (["ray", "ray-stream"] if args.ray else [])
    print(f"\nseconds per weight version (median of {args.repeats}); MiB/s in brackets; x = vs in-process")
    print(f"{'model':>6} {'params':>11} {'MiB':>8} " + " ".join(f"{k:>24}" for k in layouts))
    for r in rows:
        cells = [f"{r[k]:8.3f}s ({r['mib'] / r[k]:7.0f}) {r[k] / r['in-process']:5.1f}x" for k in layouts]
        print(f"{r['size']:>6} {r['params']:>11,} {r['mib']:8.1f} " + " ".join(f"{c:>24}" for c in cells))


def _serve(path: Path):
    """The ``posttrain serve`` app on ``path``, on a free loopback port in a thread."""
    import socket
    import threading

    import uvicorn

    from posttrain.serve.app import Access, create_app, load_engine

    engine, tokenizer, checksum = load_engine(str(path))
    app = create_app(engine, tokenizer, served_model_name="bench", model_path=str(path), checksum=checksum,
                     access=Access(weights_root=Path(tempfile.gettempdir())))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)

    class Handle:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"

        @staticmethod
        def stop():
            server.should_exit = True
            thread.join(timeout=10)

    return Handle()


if __name__ == "__main__":
    main()
