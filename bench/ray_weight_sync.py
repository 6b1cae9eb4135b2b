"""Memory and seconds of one weight sync to Ray engine replicas: the object store vs the weight group.

Side by side in one run, on a model built here (``--model``: an embedded size, or the ~100M-parameter
Llama of bench/sync_by_model_size.py) and a local Ray with ``--replicas`` engine replicas:

- ``object_store``: `RayEngines.load_weights` (one put of the whole state dict per version, what
  async mode does), waited for until every replica acknowledged the checksum;
- ``stream <MiB>``: `RayEngines.load_buckets` (what sync mode does): the weights in buckets of that
  size, broadcast over the gloo group of the trainer and the replicas.

The trainer here is this process holding the model's weights. While a sync runs, a thread samples
its resident memory every millisecond (shared pages it writes into, such as the object store's,
count); the figure is the peak above the resident memory just before the sync. Each mode runs in a
fresh process (and Ray) with glibc's mmap threshold at 128 KiB, so memory one sync frees is not
hidden in the next one's; one sync before the measured ones warms up. Every replica must read back
the checksum that was sent (the run stops otherwise).

    .venv/bin/python bench/ray_weight_sync.py                    # 100m, object store vs 64 and 16 MiB
    .venv/bin/python bench/ray_weight_sync.py --model small --modes object_store 4 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def buckets(weights: dict, mib: float):
    from sync_by_model_size import buckets as cut

    return cut(weights, mib)


def measure(model_dir: str, mode: str, replicas: int, repeats: int) -> dict:
    """One mode in this process: the peak extra memory and the median seconds of ``repeats`` syncs."""
    import gc

    import torch
    from weight_sync_streaming import PeakRSS

    from posttrain.distributed.cluster import connect
    from posttrain.distributed.engines import RayEngines, ReplicaSpec
    from posttrain.models.hf import ModelConfig, load_model, quiet_transformers
    from posttrain.rollout import weights_checksum

    quiet_transformers()
    torch.set_num_threads(1)
    connect("", num_cpus=replicas + 1)
    model = load_model(ModelConfig(path=model_dir))
    engines = RayEngines(ReplicaSpec(path=model_dir), replicas, printer=lambda *_: None)
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    peaks, times = [], []
    try:
        for version in range(1, repeats + 2):  # the first is a warm-up: the group's start, first puts
            with torch.no_grad():
                for t in weights.values():
                    t.add_(1e-3) if t.is_floating_point() else None
            checksum = weights_checksum(weights)
            gc.collect()
            with PeakRSS() as rss:
                t0 = time.perf_counter()
                if mode == "object_store":
                    engines.load_weights(weights, version, checksum)
                    engines.wait_synced()
                else:
                    engines.load_buckets(buckets(weights, float(mode)), version, lambda: checksum)
                times.append(time.perf_counter() - t0)
            peaks.append(rss.extra)
            if sorted(engines.checksums.values()) != [checksum] * replicas:
                sys.exit(f"replicas read back {engines.checksums}, sent {checksum}")
        largest = max(t.numel() * t.element_size() for t in weights.values())
        model_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        return {"mode": mode, "peak_extra": max(peaks[1:]), "seconds": statistics.median(times[1:]),
                "largest_param": largest, "model_bytes": model_bytes, "replicas": replicas}
    finally:
        engines.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="100m", help="100m (built here) or an embedded size (nano, tiny, small)")
    ap.add_argument("--modes", nargs="+", default=["object_store", "64", "16"],
                    help="object_store and/or bucket sizes in MiB for the stream")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines only")
    ap.add_argument("--measure", nargs=2, metavar=("MODEL_DIR", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print("ROW " + json.dumps(measure(*args.measure, args.replicas, args.repeats)), flush=True)
        return
    from sync_by_model_size import build_100m

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_100m(Path(tmp)) if args.model == "100m" else build_tiny(tmp, args.model, seed=0))
        for mode in args.modes:
            cmd = [sys.executable, __file__, "--measure", model_dir, mode, "--replicas", str(args.replicas),
                   "--repeats", str(args.repeats)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
            r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                sys.exit(f"{mode} failed:\n{r.stderr[-4000:]}")
            rows += [json.loads(line[4:]) for line in r.stdout.splitlines() if line.startswith("ROW ")]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return
    mib = 2**20
    first = rows[0]
    print(f"model {first['model_bytes'] / mib:.0f} MiB, largest parameter {first['largest_param'] / mib:.1f} MiB, "
          f"{first['replicas']} replicas; peak extra resident memory of the trainer during one sync")
    print(f"{'mode':>14} {'peak MiB':>9} {'x model':>8} {'seconds':>8}")
    for row in rows:
        name = row["mode"] if row["mode"] == "object_store" else f"stream {row['mode']} MiB"
        print(f"{name:>14} {row['peak_extra'] / mib:9.1f} {row['peak_extra'] / row['model_bytes']:8.2f} "
              f"{row['seconds']:8.3f}")


if __name__ == "__main__":
    main()
