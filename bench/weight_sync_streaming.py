"""Memory and seconds of one colocated weight sync under torchrun: streamed in buckets vs whole.

Side by side in one run: the script builds a ~100M-parameter Llama with random weights (the one of
bench/sync_by_model_size.py) and launches itself under ``torchrun`` at world size 2 (gloo, CPU, one
thread a rank). Each rank loads the model, shards it with FSDP2 (`shard_model`) and holds its own
`TorchEngine`, as colocated RL does. Then, for each bucket size, one new version goes from the
shards to every rank's engine with `posttrain.rl.loop.stream_to_ranks` (what `sync_weights` runs:
`export_buckets` gathers a bucket at a time, one broadcast per bucket and dtype, each engine copies
it in; rank 0's checksum checked at the end). ``whole`` is one bucket holding the model: the gather
of every parameter before anything moves, as a sync without buckets does.

While a sync runs, a thread samples the process's resident memory every millisecond; the figure
is the peak above the resident memory just before the sync (MiB), per rank. Each bucket size runs
in fresh processes with glibc's mmap threshold fixed at 128 KiB, so memory freed by one sync is
returned to the system and the next one's peak is not hidden in it. One sync before the measured
ones warms up (its one-time costs, ~100 MiB here, are the same in every mode). Every rank's engine
must end with the same weights (the run stops otherwise), and the time is the median of
``--repeats`` syncs.

    .venv/bin/python bench/weight_sync_streaming.py            # whole, 64 MiB, 16 MiB buckets
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


class PeakRSS:
    """The peak resident memory above the level at entry, sampled every millisecond."""

    def __enter__(self):
        import psutil

        self._proc, self._stop = psutil.Process(), threading.Event()
        self.base = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def extra(self) -> int:
        return self.peak - self.base


def measure(model_dir: str, buckets_mb: list[float], repeats: int) -> None:
    """One rank under torchrun: one JSON line per bucket size."""
    import gc

    from posttrain.core.dist import init_world
    from posttrain.core.fsdp import export_buckets, shard_model
    from posttrain.models.hf import ModelConfig, load_model, quiet_transformers
    from posttrain.rl.loop import stream_to_ranks
    from posttrain.rollout import TorchEngine, weights_checksum

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    quiet_transformers()
    world = init_world("cpu")
    model = shard_model(load_model(ModelConfig(path=model_dir)), world)
    engine = TorchEngine(model_dir)
    version = 0
    for mb in buckets_mb:
        peaks, times = [], []
        for _ in range(repeats + 1):  # the first is a warm-up: one-time costs of the first sync (~100 MiB)
            with torch.no_grad():
                for p in model.parameters():  # a new version each time
                    p.add_(1e-3)
            gc.collect()
            world.barrier()
            version += 1
            with PeakRSS() as rss:
                t0 = time.perf_counter()
                stream_to_ranks(engine, export_buckets(model, world, mb), world, version)
                times.append(time.perf_counter() - t0)
            peaks.append(rss.extra)
        same = len(set(world.all_gather_object(weights_checksum(engine.model.state_dict())))) == 1
        peaks, times = peaks[1:], times[1:]
        largest = max(p.numel() * p.element_size() for p in engine.model.parameters())
        row = {"rank": world.rank, "bucket_mb": mb, "peak_extra": max(peaks), "seconds": statistics.median(times),
               "largest_param": largest,
               "params": sum(p.numel() for p in engine.model.parameters()), "same": same,
               "buckets": sum(1 for _ in export_buckets(model, world, mb))}
        for rank in range(world.world_size):  # one rank at a time: the lines of two ranks can interleave
            if rank == world.rank:
                print("ROW " + json.dumps(row), flush=True)
            world.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", nargs="+", default=["whole", "64", "16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="100m", help="100m (built here) or an embedded size (nano, tiny, small)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines only")
    parser.add_argument("--measure", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [float("inf") if b == "whole" else float(b) for b in args.buckets]
    if args.measure:
        from posttrain.core.dist import exit_rank

        measure(args.measure, sizes, args.repeats)
        exit_rank(0)  # a rank leaves as `python -m posttrain` leaves one
    from sync_by_model_size import build_100m

    from posttrain.models.hf import quiet_transformers
    from posttrain.models.tiny import build_tiny

    quiet_transformers()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_100m(Path(tmp)) if args.model == "100m" else build_tiny(tmp, args.model, seed=0))
        for bucket in args.buckets:  # each in fresh processes: freed memory kept by one would hide the next's
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
                   "--measure", model_dir, "--repeats", str(args.repeats), "--buckets", bucket]
            # big blocks straight from and back to the OS, so the resident size follows what is held
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
            r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                sys.exit(f"torchrun failed:\n{r.stderr[-4000:]}")
            rows += [json.loads(line[4:]) for line in r.stdout.splitlines() if line.startswith("ROW ")]
    if args.json:
        print("\n".join(json.dumps(x) for x in rows))
        return
    params = rows[0]["params"]
    print(f"model: {params / 1e6:.0f} M parameters, fp32 ({params * 4 / 2**20:.0f} MiB); 2 ranks, gloo, CPU; "
          f"colocated sync, median of {args.repeats}")
    print(f"{'bucket':>8} {'buckets':>8} {'rank':>4} {'peak extra MiB':>15} {'vs whole':>9} {'seconds':>8}"
          f" {'vs whole':>9}")
    whole = {x["rank"]: x for x in rows if x["bucket_mb"] == float("inf")}
    for x in rows:
        ref = whole.get(x["rank"])
        label = "whole" if x["bucket_mb"] == float("inf") else f"{x['bucket_mb']:g} MiB"
        mem_ratio = f"{x['peak_extra'] / ref['peak_extra']:.2f}" if ref else "-"
        time_ratio = f"{x['seconds'] / ref['seconds']:.2f}" if ref else "-"
        print(f"{label:>8} {x['buckets']:>8} {x['rank']:>4} {x['peak_extra'] / 2**20:>15.0f} {mem_ratio:>9}"
              f" {x['seconds']:>8.2f} {time_ratio:>9}")
    if not all(x["same"] for x in rows):
        sys.exit("the ranks' engines ended with different weights")
    print("peak extra: resident memory above its level before the sync (the engine's own copy is not extra)")


if __name__ == "__main__":
    main()
