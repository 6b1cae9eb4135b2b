"""Asynchronous RL: the rollout engine generates ahead in its own process while the trainer updates.

* `worker`: the engine process and the trainer's handle on it (message protocol in `posttrain.rollout.protocol`);
* `controller`: admission control (the staleness bound), the buffer of finished groups, the ledger;
* `selftest`: the start-up check that weights reach the engine and sampler and trainer agree;
* `run`: ``run_async``, the async counterpart of `posttrain.rl.loop.run_rl`.

See docs/async.md.
"""
