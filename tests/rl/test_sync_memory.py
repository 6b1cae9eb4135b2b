"""The colocated weight sync streamed from FSDP2 shards in buckets, under torchrun (2 gloo ranks):
a memory probe (the process's resident memory sampled every millisecond during the sync, by
bench/weight_sync_streaming.py) shows rank 0 holds about one bucket and one parameter beyond
its engine, where a sync of the whole model holds all of it; every rank's engine ends with
exactly the same weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "weight_sync_streaming.py"
SLACK = 4 * 2**20  # threads, Python objects and page rounding around the tensors


@pytest.mark.long
def test_rank0_holds_a_bucket_and_a_parameter_not_the_model():
    r = subprocess.run([sys.executable, str(BENCH), "--model", "small", "--buckets", "whole", "4", "--repeats", "2",
                        "--json"], check=False, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:] + r.stdout[-2000:]
    rows = {(x["bucket_mb"], x["rank"]): x for x in map(json.loads, r.stdout.splitlines())}
    whole, streamed = rows[(float("inf"), 0)], rows[(4.0, 0)]
    model_bytes = 4 * whole["params"]
    assert all(x["same"] for x in rows.values()), "the ranks' engines hold different weights"
    assert streamed["buckets"] >= 8
    assert whole["peak_extra"] >= 0.9 * model_bytes, whole  # the probe sees a whole model when there is one
    bound = 4 * 2**20 + streamed["largest_param"] + SLACK
    assert streamed["peak_extra"] <= bound, (streamed["peak_extra"], bound, model_bytes)
