"""A user's training loop written against the official `tinker` SDK, run by .venv-tinker's python.

`python sdk_client.py BASE_URL` drives `posttrain tinker-serve` with nothing but the SDK (no
posttrain import: this environment has none) and prints one JSON object of what it measured; the
test in .venv reads it. Sections: a LoRA client on the tiny model, a supervised loop, an RL loop
(sample with log-probs -> rewards -> importance_sampling and ppo datums -> optim_step), greedy
sampling, a save/load round trip, two clients on one base, the tokenizer, the errors the SDK
surfaces, and a session left with ``with ServiceClient(...)``.

`python sdk_client.py BASE_URL lifecycle FOLDER SAMPLER_PATH` drives a server started with
``--model FOLDER=FOLDER --max-models 2 --max-sessions 2``: training clients freed when their
session finishes or is evicted, every tokenizer loaded from the base's name, and a sampler
checkpoint of another base (SAMPLER_PATH) refused at once.
"""

from __future__ import annotations

import json
import os
import sys
import time

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
    report["named_sampler"] = tc.save_weights_for_sampler("named").result().path
    report["rl"] = {"n_samples": len(seqs), "lengths": [len(t) for t, _ in seqs], "gap": gap,
                    "prompt_logprobs_first": res.prompt_logprobs[0], "prompt_gap": prompt_gap,
                    "metrics": metrics, "moved": max(abs(a - b) for x, y in zip(trainer, after) for a, b in zip(x, y)),
                    "stop_reasons": [s.stop_reason for s in res.sequences],
                    "topk": res.topk_prompt_logprobs, "prompt_logprobs": res.prompt_logprobs}


def greedy_section(tc, prompt: list[int], report: dict) -> None:
    """temperature=0 (the cookbook's evaluators send it): the same tokens in every sample, log-probs
    the trainer's (temperature 1)."""
    sampler = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, temperature=0.0)
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3, sampling_params=params).result()
    seqs = [(list(s.tokens), list(s.logprobs)) for s in res.sequences]
    trainer = logprobs_of(tc, [datum_sl(prompt + seqs[0][0], len(prompt))])[0][len(prompt) - 1:]
    report["greedy"] = {"tokens": [t for t, _ in seqs],
                        "gap": max(abs(a - b) for _, lp in seqs for a, b in zip(lp, trainer))}


def tokenizer_section(tc, report: dict) -> None:
    """``get_tokenizer()`` of a training client loads what get_info names (the base's folder)."""
    start = time.monotonic()
    try:
        tokenizer = tc.get_tokenizer()
        out = {"round_trip": tokenizer.decode(tokenizer.encode("2 + 3 = 5", add_special_tokens=False))}
    except Exception as e:  # noqa: BLE001 - the point is whether it loads
        out = {"error": f"{type(e).__name__}: {e}"[:300]}
    out["seconds"] = time.monotonic() - start
    out["tokenizer_id"] = tc.get_info().model_data.tokenizer_id
    report["tokenizer"] = out


def guarded(report: dict, name: str, section) -> None:
    """Run a section; if it raises, its entry says what, and the sections after it still run."""
    try:
        section()
    except Exception as e:  # noqa: BLE001 - reported, for the test to name
        report[name] = {"error": f"{type(e).__name__}: {e}"[:300]}


def failure(call) -> dict:
    """What ``call()`` raised (None if nothing) and how long it took to say so."""
    start = time.monotonic()
    try:
        call()
        error = None
    except Exception as e:  # noqa: BLE001 - the point is what the SDK raises
        error = f"{type(e).__name__}: {e}"[:300]
    return {"error": error, "seconds": time.monotonic() - start}


def model_status(base_url: str, model_id: str) -> int:
    """The server's answer to ``get_info`` of a training client: 200 while it is loaded, 404 after."""
    import httpx

    r = httpx.post(f"{base_url}/api/v1/get_info", json={"model_id": model_id},
                   headers={"X-API-Key": os.environ["TINKER_API_KEY"]})
    return r.status_code


def with_block_section(base_url: str, report: dict) -> None:
    """Leaving ``with ServiceClient(...)`` finishes the session: no error, its client unloaded."""
    ids = []

    def run():
        with tinker.ServiceClient(base_url=base_url) as service:
            ids.append(service.create_lora_training_client(BASE, rank=4, seed=3).result().model_id)
            ids.append(model_status(base_url, ids[0]))

    out = failure(run)
    report["with_block"] = {"exit_error": out["error"], "status_inside": ids[1:],
                            "status_after": model_status(base_url, ids[0]) if ids else None}


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
    report["missing_sampler"] = failure(lambda: service.create_sampling_client(
        model_path="tinker://nobody/sampler_weights/none").result())
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
    guarded(report, "greedy", lambda: greedy_section(tc, prompt, report))
    guarded(report, "tokenizer", lambda: tokenizer_section(tc, report))
    state_section(service, tc, data, report)
    two_clients(service, data[:2], data[2:], report)
    errors_section(service, tc, data, report)
    report["checkpoints"] = [c.checkpoint_id for c in
                             rest.list_checkpoints(tc.model_id).result().checkpoints]
    guarded(report, "with_block", lambda: with_block_section(base_url, report))
    print("REPORT " + json.dumps(report), flush=True)


def lifecycle(base_url: str, folder: str, foreign: str) -> None:
    """On a server with two training-client slots and two sessions at most (module docstring)."""
    report = {}

    def first_session():
        with tinker.ServiceClient(base_url=base_url) as service:
            clients = [service.create_lora_training_client(folder, rank=4, seed=i).result() for i in range(2)]
            report["foreign"] = failure(lambda: service.create_sampling_client(model_path=foreign).result())
            sampler = service.create_sampling_client(base_model=folder).result()
            report["tokenizers"] = [tok.decode(tok.encode("2 + 3 = 5", add_special_tokens=False))
                                    for tok in (clients[0].get_tokenizer(), sampler.get_tokenizer())]

    report["first_session"] = failure(first_session)["error"]
    # both slots are free again: a new session gets them (a 429, retried by the SDK, while they were held)
    services, made = [], []
    for i in range(3):  # the third session evicts the first, the least recently heard from, and takes its slot
        services.append(tinker.ServiceClient(base_url=base_url))
        out = failure(lambda: made.append(services[-1].create_lora_training_client(folder, rank=4).result(timeout=20)))
        report[f"client_{i}"] = out["error"]
    report["evicted_status"] = model_status(base_url, made[0].model_id) if made else None
    report["close_errors"] = [failure(lambda: s.close("success").result(timeout=20))["error"] for s in services]
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    if sys.argv[2:3] == ["lifecycle"]:
        lifecycle(sys.argv[1], sys.argv[3], sys.argv[4])
    else:
        main(sys.argv[1])
