"""`posttrain tinker-serve --sampler vllm` against a real vLLM server (the session's LoRA server,
from .venv-vllm), driven over loopback HTTP as the SDK drives it: each sampler snapshot is pushed as
a LoRA adapter (verified by version and probe), samples carry the trained adapter's log-probs (equal
to the trainer's, far from the base's), greedy decoding equals the TorchEngine sampler's, and bad
requests stay 4xx."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from posttrain.tinker import wire
from posttrain.tinker.app import Limits, create_app
from posttrain.tinker.cli import load_base
from tests.serve.conftest import RunningServer
from tests.tinker.test_tinker_server import result, sequences_of

pytestmark = pytest.mark.vllm

TOL = 1e-4
"""Sampler vs trainer log-probs (fp32 on both sides; measured ~1e-6)."""
PROMPT = [5, 17, 42, 99, 7]


@pytest.fixture(scope="module")
def servers(vllm_lora_server, vllm_model_dir, tmp_path_factory):
    """One tinker-serve sampling on vLLM and one on the TorchEngine, sharing a checkpoint root."""
    import httpx

    from posttrain.tinker.samplers import VLLMSampling

    root = tmp_path_factory.mktemp("tinker-vllm")
    limits = Limits(max_models=8, max_samples=8, max_new_tokens=32)

    def vllm(tokenizer):
        return VLLMSampling(vllm_lora_server.urls, model_path=str(vllm_model_dir), tokenizer=tokenizer,
                            weights_dir=root / "_vllm")

    bases = {"vllm": load_base("tiny", vllm_model_dir, None, vllm), "torch": load_base("tiny", vllm_model_dir, None)}
    with RunningServer(create_app({"tiny": bases["vllm"]}, root, api_key=None, limits=limits)) as on_vllm, \
            RunningServer(create_app({"tiny": bases["torch"]}, root, api_key=None, limits=limits)) as on_torch:
        with httpx.Client(base_url=on_vllm.url, timeout=120) as a, httpx.Client(base_url=on_torch.url, timeout=120) as b:
            yield a, b, bases
    bases["vllm"].use_snapshot("base", None)  # the session server is left serving its base unchanged
    bases["vllm"].sampling.close()


def new_client(http, rank=8) -> str:
    session = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
    body = {"session_id": session, "model_seq_id": 0, "base_model": "tiny", "lora_config": {"rank": rank, "seed": 0}}
    return result(http, http.post("/api/v1/create_model", json=body))["model_id"]


def train(http, model_id, steps=4):
    tokens = PROMPT + [60, 61, 62, 63]
    data = [(tokens[:-1], {"target_tokens": np.array(tokens[1:]), "weights": np.ones(len(tokens) - 1, np.float32)})]
    for _ in range(steps):
        result(http, http.post("/api/v1/forward_backward", content=wire.encode_forward_backward(model_id, 1, "cross_entropy", data)))
        result(http, http.post("/api/v1/optim_step", json={"model_id": model_id, "adam_params": {"learning_rate": 0.02}}))


def trainer_logprobs(http, model_id, tokens) -> np.ndarray:
    """The training client's log-probs of ``tokens[1:]`` (a forward, no gradient)."""
    data = [(tokens[:-1], {"target_tokens": np.array(tokens[1:]), "weights": np.ones(len(tokens) - 1, np.float32)})]
    out = result(http, http.post("/api/v1/forward_backward",
                                 content=wire.encode_forward_backward(model_id, 1, "cross_entropy", data, forward_only=True)))
    record = wire.fields(wire.fields(out)[2][0])
    fields = {wire._text(wire.fields(e), 1): wire.fields(wire.fields(e)[2][0]) for e in record[2]}
    return np.frombuffer(fields["logprobs"][1][0], dtype="<f4")


def sample(http, sampler_id, params, n=1, prompt_logprobs=False, topk=0):
    r = http.post("/api/v1/asample", json={"sampling_session_id": sampler_id, "num_samples": n, "sampling_params": params,
                                           "prompt_logprobs": prompt_logprobs, "topk_prompt_logprobs": topk,
                                           "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]}})
    out = result(http, r)
    prompt_lp = wire.fields(out).get(2)
    prompt_lp = np.frombuffer(prompt_lp[0], dtype="<f4") if prompt_lp else None
    if not topk:
        return sequences_of(out), prompt_lp
    f = wire.fields(wire.fields(out)[3][0])
    shape = (f[4][0], f[3][0])
    return (sequences_of(out), prompt_lp, np.frombuffer(f[1][0], dtype="<i4").reshape(shape),
            np.frombuffer(f[2][0], dtype="<f4").reshape(shape))


def base_logprobs(model_dir, tokens) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        x = torch.tensor([tokens])
        return model(x).logits[0, :-1].log_softmax(-1).gather(-1, x[0, 1:, None]).squeeze(-1).numpy()


def test_samples_come_from_vllm_with_the_trained_adapter(servers, vllm_model_dir):
    http, _, bases = servers
    model_id = new_client(http)
    train(http, model_id)
    sampling = bases["vllm"].sampling
    pushed = sampling.version
    sid = result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": model_id}))["sampling_session_id"]
    seqs, prompt_lp = sample(http, sid, {"max_tokens": 12, "temperature": 1.0}, n=4, prompt_logprobs=True)
    assert sampling.version == pushed + 1 and sampling.held is sampling.adapter  # one push, adapter-only
    assert len(seqs) == 4 and len({tuple(t) for t, _ in seqs}) > 1
    gap, from_base = 0.0, 0.0
    for tokens, logprobs in seqs:
        full = PROMPT + tokens
        mine = trainer_logprobs(http, model_id, full)
        gap = max(gap, float(np.abs(mine[len(PROMPT) - 1:] - logprobs).max()))
        from_base = max(from_base, float(np.abs(base_logprobs(vllm_model_dir, full)[len(PROMPT) - 1:] - logprobs).max()))
    gap = max(gap, float(np.abs(trainer_logprobs(http, model_id, PROMPT) - prompt_lp[1:]).max()))
    print(f"\nvLLM sampler vs trainer log-prob gap: {gap:.2e} (vs the base: {from_base:.2f})")
    assert gap < TOL, gap
    assert from_base > 0.1, from_base  # the adapter is applied
    # the base sampler asks for the server's own model, with the adapter zeroed first (vLLM's CPU
    # build leaks a loaded adapter's lm_head into requests without one): the base's log-probs
    base_sid = http.post("/api/v1/create_sampling_session", json={"base_model": "tiny"}).json()["sampling_session_id"]
    _, base_lp = sample(http, base_sid, {"max_tokens": 1}, prompt_logprobs=True)
    assert sampling.version == pushed + 2 and sampling.held is sampling.base and not sampling.loaded
    np.testing.assert_allclose(base_lp[1:], base_logprobs(vllm_model_dir, PROMPT), atol=TOL)


def test_greedy_samples_equal_the_torch_engine_sampler(servers):
    """A named sampler checkpoint of a client trained on the vLLM server, sampled greedily (top_k 1)
    by both servers: the same tokens, prompt log-probs and top-5 prompt log-probs."""
    on_vllm, on_torch, _ = servers
    model_id = new_client(on_vllm)
    train(on_vllm, model_id, steps=6)
    path = result(on_vllm, on_vllm.post("/api/v1/save_weights_for_sampler",
                                        json={"model_id": model_id, "path": "greedy"}))["path"]
    params = {"max_tokens": 16, "temperature": 1.0, "top_k": 1}
    answers = []
    for http in (on_vllm, on_torch):
        sid = http.post("/api/v1/create_sampling_session", json={"model_path": path}).json()["sampling_session_id"]
        answers.append(sample(http, sid, params, prompt_logprobs=True, topk=5))
    (vllm_seqs, vllm_prompt, vllm_ids, vllm_top), (torch_seqs, torch_prompt, torch_ids, torch_top) = answers
    assert vllm_ids.shape == (len(PROMPT), 5) and (vllm_ids == torch_ids).all()
    np.testing.assert_allclose(vllm_top, torch_top, atol=TOL)
    assert vllm_seqs[0][0] == torch_seqs[0][0] and len(vllm_seqs[0][0]) == 16
    np.testing.assert_allclose(vllm_prompt[1:], torch_prompt[1:], atol=TOL)
    # vLLM reports the truncated distribution's log-probs (top_k 1: certain), the TorchEngine the full one
    assert np.abs(vllm_seqs[0][1]).max() == 0.0
    full = trainer_logprobs(on_vllm, model_id, PROMPT + torch_seqs[0][0])[len(PROMPT) - 1:]
    np.testing.assert_allclose(torch_seqs[0][1], full, atol=TOL)


def test_clients_taking_turns_stay_loaded(servers):
    """Two clients' snapshots sampled in turn on the server holding two adapters: pushed once each,
    then served under their own names with no push at a switch, each with its own client's
    log-probs; a third snapshot replaces the least recently used, which is pushed again when asked for."""
    http, _, bases = servers
    sampling = bases["vllm"].sampling
    assert sampling.slots == 2  # the session server's --max-loras
    clients = [new_client(http) for _ in range(3)]
    for steps, model_id in zip((2, 5, 3), clients):
        train(http, model_id, steps=steps)
    sids = [result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": m}))["sampling_session_id"]
            for m in clients]
    own = [trainer_logprobs(http, m, PROMPT) for m in clients]
    assert np.abs(own[0] - own[1]).max() > 0.05  # different adapters
    pushed, seconds = sampling.version, []
    for turn in (0, 1, 0, 1, 0):
        start = time.perf_counter()
        _, prompt_lp = sample(http, sids[turn], {"max_tokens": 2}, prompt_logprobs=True)
        seconds.append(time.perf_counter() - start)
        np.testing.assert_allclose(prompt_lp[1:], own[turn], atol=TOL)
    assert sampling.version == pushed + 2  # the first turn of each, then none
    print(f"\nvLLM sampler, clients taking turns: {np.mean(seconds[:2]):.2f} s a turn with a push, "
          f"{np.mean(seconds[2:]):.2f} s without")
    names = dict(sampling.resident)
    assert sorted(names.values()) == ["tinker-0", "tinker-1"]
    _, prompt_lp = sample(http, sids[2], {"max_tokens": 2}, prompt_logprobs=True)  # replaces client 1's (LRU)
    np.testing.assert_allclose(prompt_lp[1:], own[2], atol=TOL)
    for turn in (0, 1):
        _, prompt_lp = sample(http, sids[turn], {"max_tokens": 2}, prompt_logprobs=True)
        np.testing.assert_allclose(prompt_lp[1:], own[turn], atol=TOL)
    assert sampling.version == pushed + 4  # client 2's, then client 1's again; client 0 stayed
    for model_id in clients:
        http.post("/api/v1/unload_model", json={"model_id": model_id})


def test_bad_requests_stay_4xx(servers):
    http, _, bases = servers
    wide = new_client(http, rank=64)  # the session server takes rank <= 32
    sid = result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": wide}))["sampling_session_id"]
    pushed = bases["vllm"].sampling.version
    prompt = {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]}
    for body, words in [({"sampling_params": {"max_tokens": 4}}, "rank <= 32"),
                        ({"sampling_params": {"max_tokens": 33}}, "max_tokens"),
                        ({"sampling_params": {"max_tokens": 4}, "topk_sample_logprobs": 2}, "not served"),
                        ({"sampling_params": {"max_tokens": 4}, "topk_prompt_logprobs": 21}, "0..20"),
                        ({"sampling_params": {"max_tokens": 4, "temperature": -1}}, "temperature")]:
        r = http.post("/api/v1/asample", json={"sampling_session_id": sid, "prompt": prompt} | body)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert bases["vllm"].sampling.version == pushed  # nothing was pushed
    http.post("/api/v1/unload_model", json={"model_id": wide})


def test_the_command_checks_its_vllm_servers(vllm_server, vllm_lora_server, vllm_model_dir, tmp_path, capsys):
    """One line and exit 2 before serving: a server without LoRA, a server on another model (its
    base probe differs), no server named."""
    from posttrain.cli import main
    from posttrain.models.tiny import build_tiny

    other = build_tiny(tmp_path / "other", "tiny", seed=1)  # same vocabulary, other weights
    serve = ["tinker-serve", "--root", str(tmp_path), "--port", "0", "--sampler", "vllm"]
    for url, model, words in [(vllm_server.urls[0], vllm_model_dir, "LoRA is off"),
                              (vllm_lora_server.urls[0], other, "serves another model than --model")]:
        assert main(serve + ["--model", f"tiny={model}", "--vllm-url", url]) == 2
        assert words in capsys.readouterr().err
    assert main(serve) == 2 and "--vllm-url URL) or --vllm-launch" in capsys.readouterr().err
