"""`posttrain tinker-serve` over plain HTTP, no SDK: the key rule, 4xx for bad requests, the
protobuf codec, the loss mapping against hand-worked numbers, and a forward/backward whose
log-probs equal the model's own (a fresh adapter is the base)."""

from __future__ import annotations

import math
import time

import httpx
import numpy as np
import pytest
import torch

from posttrain.cli import main
from posttrain.tinker import wire
from posttrain.tinker.app import Limits, create_app
from posttrain.tinker.cli import load_base
from posttrain.tinker.losses import LossInputError, check_request, per_token_loss
from tests.serve.conftest import RunningServer

KEY = "tml-test-key"


@pytest.fixture(scope="module")
def server(nano_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker-root")
    app = create_app({"nano": load_base("nano", nano_model_dir, None)}, root, api_key=KEY,
                     limits=Limits(max_models=3, max_samples=4, max_new_tokens=16, max_snapshots=2))
    with RunningServer(app) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"X-API-Key": KEY}, timeout=60) as c:
        c.app_state = server.app.state.tinker
        yield c


def result(http, handle, wait_s: float = 3.0):
    """Poll a future as the SDK does: its JSON, or the protobuf bytes of a forward/backward."""
    assert handle.status_code == 200, handle.text
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        r = http.post("/api/v1/retrieve_future", json={"request_id": handle.json()["request_id"]})
        assert r.status_code == 200, r.text
        if r.headers["content-type"].startswith("application/x-protobuf"):
            return r.content
        if r.json().get("type") != "try_again":
            return r.json()
        time.sleep(0.02)
    raise AssertionError("the future never finished")


@pytest.fixture(scope="module")
def model_id(http):
    session = http.post("/api/v1/create_session", json={"tags": [], "sdk_version": "x"}).json()["session_id"]
    body = {"session_id": session, "model_seq_id": 0, "base_model": "nano", "lora_config": {"rank": 4, "seed": 0}}
    return result(http, http.post("/api/v1/create_model", json=body))["model_id"]


def test_key_needed_except_health(server):
    with httpx.Client(base_url=server.url) as c:
        assert c.get("/api/v1/healthz").status_code == 200
        r = c.post("/api/v1/create_session", json={})
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        assert c.post("/api/v1/create_session", json={}, headers={"X-API-Key": "tml-wrong"}).status_code == 401
        ok = c.post("/api/v1/create_session", json={"tags": []}, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["session_id"]


def test_beyond_loopback_needs_key(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("POSTTRAIN_API_KEY", raising=False)
    assert main(["tinker-serve", "--root", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "needs an API key" in capsys.readouterr().err
    assert main(["tinker-serve", "--root", str(tmp_path / "missing")]) == 2
    assert main(["tinker-serve", "--root", str(tmp_path), "--model", "x=" + str(tmp_path)]) == 2
    assert main(["tinker-serve", "--root", str(tmp_path), "--max-sessions", "0"]) == 2
    assert "--max-sessions=0: must be >= 1" in capsys.readouterr().err


def fb_body(model_id, loss="cross_entropy", tokens=(3, 4, 5, 6), **inputs):
    n = len(tokens)
    inputs = {"target_tokens": np.array(list(tokens[1:]) + [7], dtype=np.int64),
              "weights": np.ones(n, dtype=np.float32)} | inputs
    return wire.encode_forward_backward(model_id, 1, loss, [(list(tokens), inputs)])


@pytest.mark.parametrize("case, status, words", [
    ("garbage", 400, "field"), ("dro", 400, "'dro' is not supported"), ("missing", 400, "needs 'weights'"),
    ("length", 400, "expected [4]"), ("extra", 400, "not read by cross_entropy"), ("vocab", 400, "token ids"),
    ("model", 404, "no such training client"),
])
def test_forward_backward_bad_requests(http, model_id, case, status, words):
    body = {"garbage": b"\x0a\xff\xff\xff\xff\x0f",
            "dro": fb_body(model_id, "dro"),
            "missing": wire.encode_forward_backward(model_id, 1, "cross_entropy",
                                                    [([1, 2], {"target_tokens": np.array([2, 3])})]),
            "length": fb_body(model_id, weights=np.ones(3, dtype=np.float32)),
            "extra": fb_body(model_id, advantages=np.ones(4, dtype=np.float32)),
            "vocab": fb_body(model_id, tokens=(3, 4, 5, 10**6)),
            "model": fb_body("nope")}[case]
    r = http.post("/api/v1/forward_backward", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


@pytest.mark.parametrize("route, body, status, words", [
    ("/api/v1/create_model", {"session_id": "s", "model_seq_id": 9, "base_model": "nope", "lora_config": {"rank": 4}},
     400, "not served here"),
    ("/api/v1/optim_step", {"model_id": "nope", "adam_params": {}}, 404, "no such training client"),
    ("/api/v1/load_weights", {"model_id": "x", "path": "tinker://../weights/x", "optimizer": True}, 400, "plain names"),
    ("/api/v1/load_weights", {"model_id": "x", "path": "/etc/passwd", "optimizer": True}, 400, "tinker://"),
    ("/api/v1/retrieve_future", {"request_id": "req-nope"}, 404, "no such request"),
    ("/api/v1/asample", {"sampling_session_id": "nope"}, 404, "no such sampler"),
    ("/api/v1/no_such_route", {}, 404, "no such route"),
])
def test_bad_requests_are_4xx(http, route, body, status, words):
    r = http.post(route, json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


def test_rank_and_model_count_bounds(http, model_id):
    session = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
    bad = {"session_id": session, "model_seq_id": 0, "base_model": "nano", "lora_config": {"rank": 0}}
    assert http.post("/api/v1/create_model", json=bad).status_code == 400
    codes = []
    for seq in range(4):
        body = {"session_id": session, "model_seq_id": seq, "base_model": "nano", "lora_config": {"rank": 2}}
        r = http.post("/api/v1/create_model", json=body)
        codes.append(r.status_code)
        if r.status_code == 200:
            result(http, r)
    assert codes.count(429) >= 1 and codes[0] == 200  # three clients at most (one is model_id's)
    # a session that stopped beating gives its clients up when room is needed
    other = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
    http.app_state.sessions[session] = 0.0
    body = {"session_id": other, "model_seq_id": 0, "base_model": "nano", "lora_config": {"rank": 2}}
    result(http, http.post("/api/v1/create_model", json=body))
    assert http.post("/api/v1/session_heartbeat", json={"session_id": session}).status_code == 410
    assert not any(m.startswith(session) for m in http.app_state.models)
    result(http, http.post("/api/v1/unload_model", json={"model_id": f"{other}:train:0"}))


def test_sampling_bounds(http, model_id):
    sid = result(http, http.post("/api/v1/save_weights_for_sampler",
                                 json={"model_id": model_id, "sampling_session_seq_id": 0}))["sampling_session_id"]
    prompt = {"chunks": [{"type": "encoded_text", "tokens": [3, 4, 5]}]}
    for params, n, words in [({"max_tokens": 17}, 1, "max_tokens"), ({"max_tokens": 4}, 5, "num_samples"),
                             ({"max_tokens": 4, "temperature": -0.5}, 1, "temperature")]:
        r = http.post("/api/v1/asample", json={"sampling_session_id": sid, "prompt": prompt, "num_samples": n,
                                               "sampling_params": params})
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    r = http.post("/api/v1/asample", json={"sampling_session_id": sid, "prompt": prompt, "num_samples": 2,
                                           "sampling_params": {"max_tokens": 4, "seed": 1}})
    out = wire.fields(result(http, r))
    assert len(out[1]) == 2 and len(r.json()["sample_sequence_ids"]) == 2
    for _ in range(2):  # two more snapshots: the first is dropped (at most two kept)
        result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": model_id}))
    r = http.post("/api/v1/asample", json={"sampling_session_id": sid, "prompt": prompt,
                                           "sampling_params": {"max_tokens": 4}})
    assert r.status_code == 404 and "at most 2 weight snapshots" in r.json()["error"]["message"]


def test_forward_backward_matches_the_model(http, model_id, nano_model_dir):
    """A fresh adapter (B = 0) is the base: log-probs equal the HF model's, loss:sum is -Σ w·logp."""
    from transformers import AutoModelForCausalLM

    tokens, weights = [3, 4, 5, 6, 9], np.array([0, 1, 1, 0.5, 2], dtype=np.float32)
    targets = np.array([4, 5, 6, 9, 11])
    body = wire.encode_forward_backward(model_id, 1, "cross_entropy",
                                        [(tokens, {"target_tokens": targets, "weights": weights})], forward_only=True)
    out = result(http, http.post("/api/v1/forward_backward", content=body))
    f = wire.fields(out)
    record = wire.fields(f[2][0])
    fields = {wire._text(wire.fields(e), 1): wire.fields(wire.fields(e)[2][0]) for e in record[2]}
    logprobs = np.frombuffer(fields["logprobs"][1][0], dtype="<f4")
    metrics = {wire._text(wire.fields(e), 1): wire._double(wire.fields(e)[2][0]) for e in f[3]}
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir)
    with torch.no_grad():
        ref = model(torch.tensor([tokens])).logits[0].log_softmax(-1)[torch.arange(5), torch.tensor(targets)]
    np.testing.assert_allclose(logprobs, ref.numpy(), atol=1e-5)
    assert metrics["loss:sum"] == pytest.approx(-(weights * ref.numpy()).sum(), abs=1e-4)


def test_a_failed_load_fails_its_future_only(http, model_id):
    r = http.post("/api/v1/load_weights", json={"model_id": model_id, "path": "tinker://nobody/weights/none",
                                                "optimizer": False})
    failed = result(http, r)
    assert failed["category"] == "user" and "no checkpoint" in failed["error"]
    ok = result(http, http.post("/api/v1/forward_backward", content=fb_body(model_id)))
    assert isinstance(ok, bytes)


def losses_of(name, logp, old, adv, **config):
    x = {"logprobs": torch.tensor([old]), "advantages": torch.tensor([adv]), "weights": torch.tensor([adv])}
    loss, _ = per_token_loss(name, torch.tensor([logp]), x, torch.ones(1, len(logp)), check_request(name, config))
    return loss[0].tolist()


def test_losses_by_hand():
    half, quarter = math.log(0.5), math.log(0.25)
    # ratio 2 on token 0, 0.5 on token 1; advantages +1 and -1
    logp, old, adv = [half, quarter], [quarter, half], [1.0, -1.0]
    assert losses_of("cross_entropy", logp, old, adv) == pytest.approx([-half, quarter])
    assert losses_of("importance_sampling", logp, old, adv) == pytest.approx([-2.0, 0.5])
    assert losses_of("ppo", logp, old, adv) == pytest.approx([-1.2, 0.8])  # max(-Aρ, -A·clip(ρ, .8, 1.2))
    assert losses_of("ppo", logp, old, adv, clip_low_threshold=0.5, clip_high_threshold=3.0) == pytest.approx([-2, .5])
    assert losses_of("cispo", logp, old, adv) == pytest.approx([-1.2 * half, 0.8 * quarter])
    # gspo: one ratio per sequence, exp(mean log-ratio) = exp(0) = 1 here: -A each
    assert losses_of("gspo", logp, old, adv) == pytest.approx([-1.0, 1.0])
    with pytest.raises(LossInputError, match="not understood"):
        check_request("cross_entropy", {"clip_low_threshold": 0.9})
    with pytest.raises(LossInputError, match="clip_low_threshold <= 1"):
        losses_of("ppo", logp, old, adv, clip_low_threshold=1.5)


def test_wire_round_trip_and_truncation():
    tokens, targets = [1, 2, 3], np.array([2, 3, 4])
    body = wire.encode_forward_backward("m:train:0", 7, "ppo", [(tokens, {"target_tokens": targets})])
    req = wire.decode_forward_backward(body)
    assert (req.model_id, req.seq_id, req.loss_fn, req.forward_only) == ("m:train:0", 7, "ppo", False)
    assert req.data[0].tokens == tokens and req.data[0].inputs["target_tokens"].tolist() == [2, 3, 4]
    for cut in (3, len(body) // 2, len(body) - 1):
        with pytest.raises(wire.WireError):
            wire.decode_forward_backward(body[:cut])
    out = wire.fields(wire.encode_sample_response([("length", [5, 6], [-0.5, -1.5])], [math.nan, -2.0]))
    seq = wire.fields(out[1][0])
    assert seq[1] == [1] and np.frombuffer(seq[3][0], dtype="<f4").tolist() == [-0.5, -1.5]


def sequences_of(out: bytes) -> list[tuple[list[int], np.ndarray]]:
    return [(np.frombuffer(wire.fields(s)[2][0], dtype="<i4").tolist(), np.frombuffer(wire.fields(s)[3][0], dtype="<f4"))
            for s in wire.fields(out)[1]]


def test_waiting_samples_of_one_snapshot_share_an_engine_call(http, model_id, nano_model_dir):
    """Requests queued while the worker is busy: those of two sampling sessions on the base (and of
    different prompt lengths) run as one engine call, a client snapshot's as another; every
    sample's log-probs are still the model's own for its prompt (the batch's padding leaks nothing)."""
    import threading

    from transformers import AutoModelForCausalLM

    state = http.app_state
    snapshot = result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": model_id}))
    bases = [http.post("/api/v1/create_sampling_session", json={"base_model": "nano"}).json()["sampling_session_id"]
             for _ in range(2)]
    prompts = [[3, 4, 5], [7, 8, 9, 10, 11, 12], [5]]
    params = {"max_tokens": 6, "temperature": 1.0}
    gate = threading.Event()
    state.worker.submit(gate.wait, 30)  # the worker is busy: the requests below wait together
    calls = state.samples.engine_calls
    sent = [http.post("/api/v1/asample", json={"sampling_session_id": sid, "num_samples": 3, "sampling_params": params,
                                               "prompt": {"chunks": [{"type": "encoded_text", "tokens": p}]}})
            for sid, p in [(bases[0], prompts[0]), (bases[1], prompts[1]), (bases[0], prompts[2])]]
    own = http.post("/api/v1/asample", json={"sampling_session_id": snapshot["sampling_session_id"], "num_samples": 2,
                                             "sampling_params": params,
                                             "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompts[0]}]}})
    gate.set()
    outs = [sequences_of(result(http, r)) for r in sent]
    assert len(sequences_of(result(http, own))) == 2
    assert state.samples.engine_calls - calls == 2 and not state.samples.waiting
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir)
    for prompt, seqs in zip(prompts, outs):
        assert len(seqs) == 3
        for tokens, logprobs in seqs:
            with torch.no_grad():
                full = torch.tensor([prompt + tokens])
                ref = model(full).logits[0, len(prompt) - 1:-1].log_softmax(-1)[torch.arange(len(tokens)), full[0, len(prompt):]]
            np.testing.assert_allclose(logprobs, ref.numpy(), atol=1e-4)


def test_a_snapshots_probe_is_the_trainers_forward(http, nano_model_dir):
    """What a vLLM push is checked against (`Base.snapshot_logprobs`): for a trained client's
    snapshot, that client's own forward; for the base, the model as loaded, with the client's
    adapter in place; the TorchEngine sampler loaded with the snapshot agrees."""
    from transformers import AutoModelForCausalLM

    state = http.app_state
    session = http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]
    body = {"session_id": session, "model_seq_id": 0, "base_model": "nano", "lora_config": {"rank": 4, "seed": 1}}
    client = result(http, http.post("/api/v1/create_model", json=body))["model_id"]
    for _ in range(3):
        result(http, http.post("/api/v1/forward_backward", content=fb_body(client)))
        result(http, http.post("/api/v1/optim_step", json={"model_id": client, "adam_params": {"learning_rate": 0.05}}))
    base = state.bases["nano"]
    ids = [3, 4, 5, 6, 9, 11, 2, 8]

    def probes():
        adapter = base.adapter_state(client)
        snapshot, plain = base.snapshot_logprobs(adapter, ids), base.snapshot_logprobs(None, ids)
        base.use_snapshot("probe-test", adapter)
        return snapshot, plain, base.sampling.prompt_logprobs(ids)

    snapshot, plain, engine = state.worker.submit(probes).result()
    targets = np.array(ids[1:] + [7])
    body = wire.encode_forward_backward(client, 1, "cross_entropy", [(ids, {"target_tokens": targets,
                                        "weights": np.ones(len(ids), np.float32)})], forward_only=True)
    record = wire.fields(wire.fields(result(http, http.post("/api/v1/forward_backward", content=body)))[2][0])
    fields = {wire._text(wire.fields(e), 1): wire.fields(wire.fields(e)[2][0]) for e in record[2]}
    trainer = np.frombuffer(fields["logprobs"][1][0], dtype="<f4")[:-1]
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir)
    with torch.no_grad():
        x = torch.tensor([ids])
        ref = model(x).logits[0, :-1].log_softmax(-1).gather(-1, x[0, 1:, None]).squeeze(-1).numpy()
    np.testing.assert_allclose(snapshot, trainer, atol=1e-5)
    np.testing.assert_allclose(engine, trainer, atol=1e-5)
    np.testing.assert_allclose(plain, ref, atol=1e-5)
    assert np.abs(trainer - ref).max() > 0.05  # the client trained away from the base
    result(http, http.post("/api/v1/unload_model", json={"model_id": client}))


def test_vllm_sampler_flags_checked_before_anything_starts(tmp_path, capsys):
    serve = ["tinker-serve", "--root", str(tmp_path), "--port", "0"]
    for extra, words in [(["--sampler", "vllm"], "(--vllm-url URL) or --vllm-launch"),
                         (["--vllm-url", "http://127.0.0.1:9"], "only with --sampler vllm"),
                         (["--sampler", "vllm", "--vllm-launch", "--vllm-max-lora-rank", "0"], "must be in 1..256")]:
        assert main(serve + extra) == 2
        assert words in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written: no tiny model built, no server started


def test_topk_prompt_logprobs_against_a_slow_reference(http, nano_model_dir):
    """``topk_prompt_logprobs`` on the TorchEngine sampler: at each prompt position the k likeliest
    next tokens and their log-probs, as a separate forward of each prefix and a sort of the whole
    vocabulary give them; row 0 (no context) is the SDK's empty row; k past the bound is a 400."""
    from transformers import AutoModelForCausalLM

    sid = http.post("/api/v1/create_sampling_session", json={"base_model": "nano"}).json()["sampling_session_id"]
    prompt, k = [3, 4, 5, 9, 2, 7], 5
    body = {"sampling_session_id": sid, "num_samples": 1, "sampling_params": {"max_tokens": 1},
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]}, "prompt_logprobs": True}
    out = wire.fields(result(http, http.post("/api/v1/asample", json=body | {"topk_prompt_logprobs": k})))
    topk = wire.fields(out[3][0])
    assert (topk[3], topk[4]) == ([k], [len(prompt)])
    ids = np.frombuffer(topk[1][0], dtype="<i4").reshape(len(prompt), k)
    logprobs = np.frombuffer(topk[2][0], dtype="<f4").reshape(len(prompt), k)
    assert (ids[0] == wire.TOPK_MASK[0]).all() and (logprobs[0] == wire.TOPK_MASK[1]).all()
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir)
    for t in range(1, len(prompt)):
        with torch.no_grad():
            row = model(torch.tensor([prompt[:t]])).logits[0, -1].double().log_softmax(-1).tolist()
        best = sorted(range(len(row)), key=lambda v: -row[v])[:k]
        assert ids[t].tolist() == best, t
        np.testing.assert_allclose(logprobs[t], [row[v] for v in best], atol=1e-5)
    prompt_lp = np.frombuffer(out[2][0], dtype="<f4")
    assert (prompt_lp[1:] <= logprobs[1:, 0] + 1e-6).all()  # nothing beats the top token
    without = wire.fields(result(http, http.post("/api/v1/asample", json=body)))
    assert 3 not in without
    r = http.post("/api/v1/asample", json=body | {"topk_prompt_logprobs": 21})
    assert r.status_code == 400 and "topk_prompt_logprobs: 0..20" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------ session lifecycle

def new_session(http) -> str:
    return http.post("/api/v1/create_session", json={"tags": []}).json()["session_id"]


def new_client(http, session: str, seq: int):
    body = {"session_id": session, "model_seq_id": seq, "base_model": "nano", "lora_config": {"rank": 2, "seed": 0}}
    return http.post("/api/v1/create_model", json=body)


def free_slots(http) -> int:
    return http.app_state.limits.max_models - len(http.app_state.models)


def drain(http) -> None:
    """Wait until the worker has run everything queued before now (it runs in order)."""
    http.app_state.worker.submit(lambda: None).result(30)


def test_finish_unloads_the_sessions_clients(http):
    """``POST /api/v1/sessions/{id}/finish`` (what leaving ``with ServiceClient(...)`` sends): 200,
    the session's clients unloaded at once (their slots free for another session), its heartbeat
    410; finishing again is a 200 (the first reason stands), an unknown session a 404."""
    state = http.app_state
    session = new_session(http)
    ids = [result(http, new_client(http, session, seq))["model_id"] for seq in range(free_slots(http))]
    snapshot = result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": ids[0]}))
    other = new_session(http)
    assert new_client(http, other, 0).status_code == 429  # every slot is taken
    finish = {"reason": {"type": "success"}, "detail": None}
    r = http.post(f"/api/v1/sessions/{session}/finish", json=finish)
    assert r.status_code == 200, r.text
    drain(http)
    assert not any(m in state.models or m in state.bases["nano"].adapters for m in ids)
    assert snapshot["sampling_session_id"] not in state.samplers  # its weight snapshot is dropped too
    assert http.post("/api/v1/session_heartbeat", json={"session_id": session}).status_code == 410
    assert http.post(f"/api/v1/sessions/{session}/finish", json={"reason": {"type": "errored"}}).status_code == 200
    r = http.post("/api/v1/sessions/session-nope/finish", json=finish)
    assert r.status_code == 404 and "no such session" in r.json()["error"]["message"]
    client = result(http, new_client(http, other, 0))["model_id"]
    result(http, http.post("/api/v1/unload_model", json={"model_id": client}))


def test_clients_of_an_evicted_session_are_unloaded(http):
    """A session dropped because ``max_sessions`` are open (the least recently heard from) gives
    its training clients up: a new client gets the slot (it used to be a 429 until a restart)."""
    import dataclasses

    state = http.app_state
    limits = state.limits
    old = new_session(http)
    ids = [result(http, new_client(http, old, seq))["model_id"] for seq in range(free_slots(http))]
    state.sessions[old] = min(state.sessions.values()) - 1.0  # the least recently heard from
    state.limits = dataclasses.replace(limits, max_sessions=len(state.sessions), session_timeout_s=1e9)
    try:
        newer = new_session(http)  # one too many: `old` is evicted
    finally:
        state.limits = limits
    assert old not in state.sessions
    assert http.post("/api/v1/session_heartbeat", json={"session_id": old}).status_code == 410
    r = new_client(http, newer, 0)
    assert r.status_code == 200, r.text
    client = result(http, r)["model_id"]
    drain(http)
    assert not any(m in state.models or m in state.bases["nano"].adapters for m in ids)
    result(http, http.post("/api/v1/unload_model", json={"model_id": client}))


def test_a_missing_sampler_checkpoint_is_a_4xx_at_once(http, model_id):
    """``create_sampling_session`` on a checkpoint that is not there is a 404, and on one whose base
    is not served a 400, not a 500 (which the SDK retries for a minute)."""
    import json

    from posttrain.tinker.app import checkpoint_dir

    session = new_session(http)
    body = {"session_id": session, "sampling_session_seq_id": 0, "model_path": "tinker://nobody/sampler_weights/none"}
    r = http.post("/api/v1/create_sampling_session", json=body)
    assert r.status_code == 404, r.text
    assert "no checkpoint" in r.json()["error"]["message"] and "tinker://nobody" in r.json()["error"]["message"]
    path = result(http, http.post("/api/v1/save_weights_for_sampler",
                                  json={"model_id": model_id, "path": "foreign-base"}))["path"]
    meta = checkpoint_dir(http.app_state.root, path) / "meta.json"
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"base_model": "other/model"}))
    r = http.post("/api/v1/create_sampling_session", json=body | {"model_path": path})
    assert r.status_code == 400, r.text
    assert "'other/model' is not served here" in r.json()["error"]["message"]


def test_temperature_zero_is_greedy(http, nano_model_dir):
    """``temperature=0`` (tinker-cookbook sends it) decodes greedily: every sample the argmax chain,
    its log-probs the model's at temperature 1."""
    from transformers import AutoModelForCausalLM

    sid = http.post("/api/v1/create_sampling_session", json={"base_model": "nano"}).json()["sampling_session_id"]
    prompt = [3, 4, 5, 9]
    r = http.post("/api/v1/asample", json={"sampling_session_id": sid, "num_samples": 3,
                                           "sampling_params": {"max_tokens": 6, "temperature": 0},
                                           "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]}})
    seqs = sequences_of(result(http, r))
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir)
    ids, ref = list(prompt), []
    with torch.no_grad():
        for _ in range(len(seqs[0][0])):
            logp = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
            ids.append(int(logp.argmax()))
            ref.append(float(logp.max()))
    for tokens, logprobs in seqs:
        assert tokens == ids[len(prompt):]
        np.testing.assert_allclose(logprobs, ref, atol=1e-5)


def test_get_info_reports_the_base_folder_as_tokenizer(http, model_id, nano_model_dir):
    """The SDK's ``get_tokenizer()`` loads ``model_data.tokenizer_id`` with ``AutoTokenizer``: the
    base's folder loads offline, where the served name would be looked up on the hub."""
    from transformers import AutoTokenizer

    info = http.post("/api/v1/get_info", json={"model_id": model_id}).json()
    assert info["model_data"]["tokenizer_id"] == str(nano_model_dir.resolve())
    tokenizer = AutoTokenizer.from_pretrained(info["model_data"]["tokenizer_id"])
    assert tokenizer.encode("hello world") == http.app_state.bases["nano"].tokenizer.encode("hello world")
