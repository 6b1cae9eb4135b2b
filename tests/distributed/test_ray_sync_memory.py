"""Weights streamed to Ray engine replicas over the weight group: a memory probe (the trainer
process's resident memory sampled every millisecond during the sync, by bench/ray_weight_sync.py)
shows the trainer holds about one bucket beyond its own weights, where the object-store push holds
the whole model again (twice, serialised and in the store's pages); every replica reads back the
checksum that was sent (the bench stops otherwise). Slow: a local Ray per mode; one replica each, as
the trainer's memory does not depend on how many read the stream."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ray_weight_sync.py"
SLACK = 4 * 2**20  # threads, Python objects and page rounding around the tensors

pytestmark = pytest.mark.slow


def test_the_trainer_holds_a_bucket_not_the_model():
    r = subprocess.run([sys.executable, str(BENCH), "--model", "small", "--modes", "object_store", "4",
                        "--replicas", "1", "--repeats", "2", "--json"], check=False, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:] + r.stdout[-2000:]
    rows = {x["mode"]: x for x in map(json.loads, r.stdout.splitlines())}
    store, streamed = rows["object_store"], rows["4"]
    assert store["peak_extra"] >= 0.9 * store["model_bytes"], store  # the probe sees a whole model when there is one
    bound = 4 * 2**20 + streamed["largest_param"] + SLACK
    assert streamed["peak_extra"] <= bound, (streamed["peak_extra"], bound, streamed["model_bytes"])
