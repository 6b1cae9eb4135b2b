"""`run_rl`: a run of `posttrain rl`, synchronous (`posttrain.rl.loop`) or asynchronous
(`posttrain.rl.async_.run`) by ``cfg.mode``."""

from __future__ import annotations

from posttrain.rl.config import RLConfig


def run_rl(cfg: RLConfig, printer=print) -> dict:
    """Run (or resume) RL; returns the last step's metrics."""
    if cfg.mode == "async":
        from posttrain.rl.async_.run import run_async

        return run_async(cfg, printer)
    from posttrain.rl.loop import run_sync

    return run_sync(cfg, printer)
