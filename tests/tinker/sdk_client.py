"""A user's training loop written against the official `tinker` SDK, run by .venv-tinker's python.

`python sdk_client.py BASE_URL` drives `posttrain tinker-serve` with nothing but the SDK (no
posttrain import: this environment has none) and prints one JSON object of what it measured; the
test in .venv reads it. Sections: a LoRA client on the tiny model, a supervised loop, an RL loop
(sample with log-probs -> rewards -> importance_sampling and ppo datums -> optim_step), a
save/load round trip, two clients on one base, and the errors the SDK surfaces.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tinker
from tinker import types

BASE = "posttrain/tiny"


def datum_sl(tokens: list[int], n_prompt: int) -> types.Datum:
    """Next-token targets, weight 1 on the completion only (the cookbook's datum shape)."""
    inputs, targets = tokens[:-1], tokens[1:]
    weights = [0.0] * (n_prompt - 1) + [1.0] * (len(targets) - n_prompt + 1)
    return types.Datum(model_input=types.ModelInput.from_ints(inputs),
                       loss_fn_inputs={"target_tokens": np.array(targets, dtype=np.int64),
                                       "weights": np.array(weights, dtype=np.float32)})


def datum_rl(prompt: list[int], tokens: list[int], logprobs: list[float], advantage: float) -> types.Datum:
    """The cookbook's RL datum: inputs prompt + sample[:-1], sampler log-probs and the advantage
    on the sampled positions, zeros on the prompt's."""
    full = prompt + tokens
    n = len(prompt) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                       loss_fn_inputs={"target_tokens": np.array(full[1:], dtype=np.int64),
                                       "logprobs": np.array([0.0] * n + list(logprobs), dtype=np.float32),
                                       "advantages": np.array([0.0] * n + [advantage] * len(tokens), dtype=np.float32)})


def logprobs_of(tc, data, loss="cross_entropy") -> list[list[float]]:
    out = tc.forward(data, loss).result()
    return [o["logprobs"].to_numpy().tolist() for o in out.loss_fn_outputs]


def sl_loop(tc, data, steps: int, lr: float) -> list[float]:
    losses = []
    for _ in range(steps):
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=lr))
        losses.append(fb.result().metrics["loss:sum"])
        opt.result()
    return losses


def rl_section(service, tc, prompt: list[int], report: dict) -> None:
    sampler = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=0)
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=4, sampling_params=params,
                         include_prompt_logprobs=True, topk_prompt_logprobs=3).result()
    seqs = [(list(s.tokens), list(s.logprobs)) for s in res.sequences]
    rewards = [float(len(set(t))) for t, _ in seqs]  # any scalar will do: distinct tokens
    mean = sum(rewards) / len(rewards)
    data = [datum_rl(prompt, t, lp, r - mean) for (t, lp), r in zip(seqs, rewards)]
    trainer = logprobs_of(tc, data, "importance_sampling")
    n = len(prompt) - 1
    gap = max(abs(a - b) for (t, lp), tr in zip(seqs, trainer) for a, b in zip(lp, tr[n:]))
    prompt_gap = max(abs(a - b) for a, b in zip(res.prompt_logprobs[1:], trainer[0][:n]))
    metrics = {}
    for loss in ("importance_sampling", "ppo"):
        fb = tc.forward_backward(data, loss, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
                                 if loss == "ppo" else None)
        metrics[loss] = fb.result().metrics
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = logprobs_of(tc, data, "importance_sampling")
    report["rl"] = {"n_samples": len(seqs), "lengths": [len(t) for t, _ in seqs], "gap": gap,
                    "prompt_logprobs_first": res.prompt_logprobs[0], "prompt_gap": prompt_gap,
                    "metrics": metrics, "moved": max(abs(a - b) for x, y in zip(trainer, after) for a, b in zip(x, y)),
                    "stop_reasons": [s.stop_reason for s in res.sequences],
                    "topk": res.topk_prompt_logprobs, "prompt_logprobs": res.prompt_logprobs}


def state_section(service, tc, data, report: dict) -> None:
    path = tc.save_state("round-trip").result().path
    before = logprobs_of(tc, data)
    sl_loop(tc, data, 1, 1e-3)
    continued = logprobs_of(tc, data)
    loaded = service.create_training_client_from_state_with_optimizer(path).result()
    at_load = logprobs_of(loaded, data)
    sl_loop(loaded, data, 1, 1e-3)
    report["state"] = {"path": path, "at_load_equal": at_load == before, "after_step_equal": logprobs_of(loaded, data)
                       == continued, "changed_by_step": continued != before}


def two_clients(service, data_a, data_b, report: dict) -> None:
    a = service.create_lora_training_client(BASE, rank=4, seed=1).result()
    b = service.create_lora_training_client(BASE, rank=8, seed=2).result()
    b0 = logprobs_of(b, data_b)
    losses_a = sl_loop(a, data_a, 6, 3e-3)
    b1 = logprobs_of(b, data_b)
    a1 = logprobs_of(a, data_a)
    b.forward_backward(data_b, "cross_entropy").result()  # pending gradients of b ...
    losses_a += sl_loop(a, data_a, 1, 3e-3)  # ... do not leak into a's step
    a2 = logprobs_of(a, data_a)
    report["two"] = {"a_ids": [a.model_id, b.model_id], "b_untouched_by_a": b0 == b1, "a_moved": a1 != a2,
                     "losses_a": losses_a}
    # a's next step with b's gradients still pending must equal a step of a alone: replay it on a copy
    path = a.save_state("a-now").result().path
    c = service.create_training_client_from_state_with_optimizer(path).result()
    sl_loop(a, data_a, 1, 3e-3)
    sl_loop(c, data_a, 1, 3e-3)
    report["two"]["a_equals_replay"] = logprobs_of(a, data_a) == logprobs_of(c, data_a)


def errors_section(service, tc, data, report: dict) -> None:
    out = {}
    for name, call in [("dro", lambda: tc.forward_backward(data, "dro").result()),
                       ("bad_base", lambda: service.create_lora_training_client("no/such-model", rank=4).result()),
                       ("bad_input", lambda: tc.forward_backward(data, "importance_sampling").result())]:
        try:
            call()
            out[name] = None
        except Exception as e:  # noqa: BLE001 - the point is what the SDK raises
            out[name] = f"{type(e).__name__}: {e}"[:300]
    report["errors"] = out


def main(base_url: str) -> None:
    service = tinker.ServiceClient(base_url=base_url)
    rest = tinker.RestClient(base_url=base_url)
    report = {"capabilities": [m.model_name for m in rest.get_server_capabilities().result().supported_models]}
    tc = service.create_lora_training_client(BASE, rank=8, seed=0).result()
    prompt = [5, 17, 42, 99, 7, 13]
    data = [datum_sl(prompt + [60 + i, 61 + i, 62 + i, 63 + i, 64 + i], len(prompt)) for i in range(4)]
    report["sl_losses"] = sl_loop(tc, data, 12, 3e-3)
    rl_section(service, tc, prompt, report)
    state_section(service, tc, data, report)
    two_clients(service, data[:2], data[2:], report)
    errors_section(service, tc, data, report)
    report["checkpoints"] = [c.checkpoint_id for c in
                             rest.list_checkpoints(tc.model_id).result().checkpoints]
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
