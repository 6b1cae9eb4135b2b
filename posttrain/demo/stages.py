"""The demos' stages: each one run and timed in wall and CPU seconds."""

from __future__ import annotations

import time


def timed(stages: dict, name: str, fn, *args):
    """Run one stage, recording its wall and CPU seconds (CPU: all of this process's threads, so a
    busy machine's share of the cores can be told from the work itself)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    stages[name] = {"wall_s": round(time.perf_counter() - wall, 1), "cpu_s": round(time.process_time() - cpu, 1)}
    print(f"[demo] {name}: {stages[name]['wall_s']:.0f} s wall, {stages[name]['cpu_s']:.0f} s CPU")
    return result
