"""HTTPEngine against a small OpenAI-compatible server over a real TorchEngine (the nano model).

`FakeServer` implements the contract the engine relies on and nothing more: ``GET /health``,
``POST /v1/completions`` (token-id prompt, ``n`` choices with ``token_ids`` and
``logprobs.token_logprobs``) and ``POST /update_weights_from_disk``. It runs uvicorn in a thread
on a free loopback port, records which prompts it served, and can be told to fail requests or to
misreport a checksum. The last test runs the engine against the real ``posttrain serve`` app.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import threading
import time

import pytest
import torch
from safetensors.torch import load_file

from posttrain.rollout import (
    HTTPEngine,
    Rollouts,
    SamplingParams,
    ServerUnreachable,
    TorchEngine,
    WeightSyncError,
    weights_checksum,
)
from posttrain.rollout.http import PosttrainDialect, model_eos_ids
from posttrain.rollout.weights_folder import WEIGHTS_FILE
from posttrain.rollout.types import prompt_seed
from posttrain.verifiers.evaluate import score

TEXTS = ["Compute 12 x 34.", "What is 7 times 8?", "Hello", "The answer is", "a b c d e f", "Say something long"]


class InThread:
    """An ASGI app served by uvicorn on a free loopback port, in a background thread."""

    def __init__(self, app):
        import uvicorn

        self.app = app
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class FakeServer:
    """An OpenAI-compatible rollout server over a `TorchEngine`, in a background thread."""

    def __init__(self, model_dir, name: str):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.json = JSONResponse
        self.engine = TorchEngine(str(model_dir))
        self.name = name
        self.served: list[tuple[tuple[int, ...], int]] = []  # (prompt, n) of every answered request
        self.fail = lambda prompt: False  # answer HTTP 500 to these prompts
        self.abort = lambda prompt: False  # answer these with every choice aborted, as vLLM does
        self.delay_s = 0.0  # before answering a completion
        self.events: list[tuple[str, float]] = []  # ("arrive" | "answer", time) of completions
        self.lie_about_checksum = False
        self.http = InThread(Starlette(routes=[
            Route("/health", self.health), Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/update_weights_from_disk", self.update_weights, methods=["POST"])]))
        self.url = self.http.url

    def stop(self) -> None:
        self.http.stop()

    async def health(self, request):
        return self.json({"status": "ok", "version": self.engine.version})

    async def completions(self, request):
        body = await request.json()
        prompt, n = [int(t) for t in body["prompt"]], int(body.get("n", 1))
        if self.fail(prompt):
            return self.json({"error": {"message": f"{self.name}: told to fail"}}, status_code=500)
        self.events.append(("arrive", time.monotonic()))
        await asyncio.sleep(self.delay_s)
        sampling = SamplingParams(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                                  top_k=max(0, body.get("top_k", 0)), max_new_tokens=body.get("max_tokens", 16),
                                  stop=body.get("stop") or [], seed=body.get("seed"),
                                  ignore_eos=body.get("ignore_eos", False))
        ro = self.engine.generate([prompt], n, sampling)
        self.served.append((tuple(prompt), n))
        tok = self.engine.tokenizer
        aborted = self.abort(prompt)
        choices = [{"index": j, "text": ro.texts[j],
                    "finish_reason": "abort" if aborted else "length" if why == "length" else "stop",
                    "logprobs": {"tokens": [tok.decode([t]) for t in ids], "token_logprobs": lp},
                    "token_ids": ids, "truncated_logprobs": tl, "prompt_token_ids": prompt}
                   for j, (ids, lp, tl, why) in enumerate(zip(ro.completion_ids, ro.logprobs,
                                                              ro.truncated_logprobs, ro.finish_reason))]
        self.events.append(("answer", time.monotonic()))
        return self.json({"object": "text_completion", "choices": choices, "prompt_token_ids": prompt,
                          "server": self.name})

    async def update_weights(self, request):
        body = await request.json()
        weights = load_file(f"{body['model_path']}/{WEIGHTS_FILE}")
        actual = weights_checksum(weights)
        if actual != body["checksum"]:
            return self.json({"success": False, "message": f"checksum mismatch: computed {actual}",
                              "version": self.engine.version, "checksum": actual}, status_code=400)
        self.engine.version = min(self.engine.version, body["version"])  # a new run may restart at 0
        self.engine.load_weights(weights, body["version"], actual)
        return self.json({"success": True, "message": "ok", "version": self.engine.version,
                          "checksum": "0" * 64 if self.lie_about_checksum else actual})


def real_server(model_dir) -> InThread:
    """The ``posttrain serve`` app on the model, in process."""
    app = pytest.importorskip("posttrain.serve.app")
    create_app, load_engine = app.create_app, app.load_engine

    import tempfile
    from pathlib import Path

    engine, tokenizer, checksum = load_engine(model_dir)
    access = app.Access(weights_root=Path(tempfile.gettempdir()))  # where the tests write weights
    return InThread(create_app(engine, tokenizer, served_model_name="nano", model_path=model_dir, checksum=checksum,
                               access=access))


@pytest.fixture
def servers(nano_model_dir):
    pair = [FakeServer(nano_model_dir, "a"), FakeServer(nano_model_dir, "b")]
    yield pair
    for s in pair:
        s.stop()


@pytest.fixture(scope="module")
def tokenizer(nano_model_dir):
    from posttrain.models.hf import load_tokenizer

    return load_tokenizer(str(nano_model_dir))


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


@pytest.fixture(scope="module")
def local(nano_model_dir):
    return TorchEngine(str(nano_model_dir))  # loads the tokenizer too (stop strings, texts)


def engine_for(servers, tmp_path, tokenizer, **kw) -> HTTPEngine:
    return HTTPEngine([s.url for s in servers], weights_dir=str(tmp_path / "weights"), tokenizer=tokenizer,
                      eos_ids=model_eos_ids(tokenizer.name_or_path, tokenizer), retry_backoff_s=0.01, **kw)


def per_prompt(engine, prompts, n, sampling) -> Rollouts:
    """The in-process reference of what the servers do: each prompt alone, with its own seed."""
    parts = [engine.generate([p], n, dataclasses.replace(sampling, seed=prompt_seed(sampling.seed, i)))
             for i, p in enumerate(prompts)]
    return Rollouts.concat([r.select(list(range(n)), [i] * n) for i, r in enumerate(parts)])


@pytest.mark.parametrize("stop", [[], ["e"]])
def test_greedy_is_token_exact_with_the_in_process_engine(servers, tmp_path, tokenizer, prompts, local, stop):
    engine = engine_for(servers, tmp_path, tokenizer)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, stop=stop)
    got, want = engine.generate(prompts, 1, greedy), local.generate(prompts, 1, greedy)
    assert {"eos", "stop" if stop else "length"} <= set(got.finish_reason)  # EOS told apart from a stop string
    assert got.prompt_idx == want.prompt_idx and got.prompt_ids == want.prompt_ids
    assert got.completion_ids == want.completion_ids
    for a, b in zip(got.logprobs, want.logprobs):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    assert got.finish_reason == want.finish_reason and got.texts == want.texts
    assert got.policy_version == [0] * len(prompts) and got.truncated_logprobs is not None


def test_sampling_uses_one_seed_per_prompt_and_groups_never_split(servers, tmp_path, tokenizer, prompts, local):
    engine = engine_for(servers, tmp_path, tokenizer)
    sampling = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=10, seed=123)
    got = engine.generate(prompts, 3, sampling)
    want = per_prompt(local, prompts, 3, sampling)
    assert got.prompt_idx == [i for i in range(len(prompts)) for _ in range(3)]
    assert got.completion_ids == want.completion_ids and got.finish_reason == want.finish_reason
    assert got.logprobs == want.logprobs and got.truncated_logprobs == want.truncated_logprobs
    served = [entry for s in servers for entry in s.served]
    assert sorted(served) == sorted((tuple(p), 3) for p in prompts)  # one request of n=3 per prompt
    assert all(s.served for s in servers)  # both servers took a share


def test_a_failed_request_is_retried_on_the_other_server(servers, tmp_path, tokenizer, prompts, local):
    servers[0].fail = lambda prompt: True
    engine = engine_for(servers, tmp_path, tokenizer)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)
    got = engine.generate(prompts, 2, sampling)
    assert got.completion_ids == per_prompt(local, prompts, 2, sampling).completion_ids
    assert "error" not in got.finish_reason
    assert not servers[0].served and len(servers[1].served) == len(prompts)
    assert engine.stats["retries"] > 0 and engine.stats["failed"] == 0


def test_a_request_every_server_fails_gives_error_samples_scored_infra_fail(servers, tmp_path, tokenizer, prompts):
    bad = tuple(prompts[1])
    for s in servers:
        s.fail = lambda prompt: tuple(prompt) == bad
    engine = engine_for(servers, tmp_path, tokenizer, retries=2)
    ro = engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
    assert ro.finish_reason[2:4] == ["error", "error"] and ro.completion_ids[2:4] == [[], []]
    assert "error" not in ro.finish_reason[:2] + ro.finish_reason[4:]
    assert engine.stats["failed"] == 1
    outcomes = score(lambda text, ex: pytest.fail("the verifier must not judge a missing sample"),
                     ro.completion_texts()[2:4], [{}, {}], ro.finish_reason[2:4])
    assert [(o.cls.value, o.reason) for o in outcomes] == [("INFRA_FAIL", "rollout_error")] * 2
    assert ro.to_padded().completion_mask_BT[2:4].sum() == 0


def test_weight_sync_is_confirmed_by_every_server_and_old_versions_are_pruned(servers, tmp_path, tokenizer,
                                                                               prompts, nano_model_dir):
    engine = engine_for(servers, tmp_path, tokenizer)
    reference = TorchEngine(str(nano_model_dir))
    state = {k: v.clone() for k, v in reference.model.state_dict().items()}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    for version in (1, 2, 3):
        state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}
        checksum = weights_checksum(state)
        engine.load_weights(state, version, checksum)
        reference.load_weights(state, version, checksum)
        assert engine.version == version and all(s.engine.version == version for s in servers)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v2", "v3"]
    got, want = engine.generate(prompts, 1, greedy), reference.generate(prompts, 1, greedy)
    assert got.completion_ids == want.completion_ids and got.policy_version == [3] * len(prompts)


def test_a_refused_or_misreported_checksum_raises_naming_the_server(servers, tmp_path, tokenizer, nano_model_dir):
    engine = engine_for(servers, tmp_path, tokenizer)
    weights = dict(TorchEngine(str(nano_model_dir)).model.state_dict())
    with pytest.raises(WeightSyncError) as refused:  # both servers compute another checksum: 400
        engine.load_weights(weights, 1, "f" * 64)
    assert servers[0].url in str(refused.value) and servers[1].url in str(refused.value)
    assert "400" in str(refused.value) and engine.version == 0
    servers[1].lie_about_checksum = True
    with pytest.raises(WeightSyncError) as lied:
        engine.load_weights(weights, 1, weights_checksum(weights))
    assert servers[1].url in str(lied.value) and servers[0].url not in str(lied.value)
    assert engine.version == 0  # no rollout is attributed to version 1


def _dead_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def test_the_same_failure_again_is_counted_into_one_line_per_server(servers, tmp_path, tokenizer, prompts, caplog):
    """A server whose engine died answers every request the same HTTP 500: one line as it happens,
    one line that sums up the rest, not a line per request."""
    for s in servers:
        s.fail = lambda prompt: True
    engine = engine_for(servers, tmp_path, tokenizer, retries=1)
    with caplog.at_level(logging.WARNING, logger="posttrain.rollout.http.completions"):
        ro = engine.generate(prompts, 2, SamplingParams(temperature=1.0, max_new_tokens=4, seed=1))
    assert set(ro.finish_reason) == {"error"}
    said = [r.getMessage() for r in caplog.records]
    first = [m for m in said if "completion request failed" in m]
    summed = [m for m in said if "more completion requests failed the same way" in m]
    assert len(first) == 2 and len(summed) == 2 and len(said) == 4, said
    more = sum(int(m.split(": ")[1].split()[0]) for m in summed)
    assert more + len(first) == len(prompts) * 2  # every try of every prompt is counted once


def test_an_unreachable_server_is_a_one_line_error_and_exit_1(nano_model_dir, arith_data_dir, tmp_path, capsys):
    from posttrain.cli import main

    dead = _dead_url()
    with pytest.raises(ServerUnreachable, match=dead):
        HTTPEngine([dead])
    code = main(["rl", f"model.path={nano_model_dir}", f"data.path={arith_data_dir / 'prompts_train.jsonl'}",
                 "rollout.backend=openai", f"rollout.urls=['{dead}']", f"out_dir={tmp_path / 'run'}",
                 "logging.progress=false"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and dead in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("status,kw,said", [
    (500, {"json": {"error": {"message": "EngineCore encountered an issue.", "code": 500}}},
     "500 Internal Server Error: EngineCore encountered an issue."),
    (422, {"json": {"detail": "field required"}}, "422 Unprocessable Entity: field required"),
    (503, {"text": "Service  Unavailable\n try later"}, "503 Service Unavailable: Service Unavailable try later"),
    (404, {"html": "<html><body>Not Found</body></html>"}, "404 Not Found"),
    (404, {"content": b""}, "404 Not Found")])
def test_an_answer_is_one_line_with_the_servers_reason_and_no_page(status, kw, said):
    import httpx

    from posttrain.rollout.http.transport import answer

    assert answer(httpx.Response(status, **kw)) == said


@pytest.mark.parametrize("backend", ["openai", "vllm"])
def test_a_url_that_answers_an_html_404_is_one_line_with_the_status_and_url(nano_model_dir, arith_data_dir, tmp_path,
                                                                            capsys, backend):
    """Another program on the port (a web server, a proxy): its page stays out of the message."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse

    page = "<!DOCTYPE html>\n<html><head><title>404</title></head>\n<body><h1>Not Found</h1></body></html>"
    app = Starlette()
    app.add_route("/{path:path}", lambda request: HTMLResponse(page, status_code=404), methods=["GET", "POST"])
    other = InThread(app)
    try:
        from posttrain.cli import main

        code = main(["rl", f"model.path={nano_model_dir}", f"data.path={arith_data_dir / 'prompts_train.jsonl'}",
                     f"rollout.backend={backend}", f"rollout.urls=['{other.url}']", f"out_dir={tmp_path / 'run'}",
                     "logging.progress=false"])
    finally:
        other.stop()
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1, err
    assert other.url in err and "GET /health answered 404 Not Found" in err, err
    assert "<" not in err and "html" not in err.lower(), err


def test_the_posttrain_serve_app_meets_the_contract(nano_model_dir, tmp_path, tokenizer, prompts, local):
    servers = [real_server(nano_model_dir) for _ in range(2)]
    try:
        engine = engine_for(servers, tmp_path, tokenizer)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=12, stop=["e"])
        got, want = engine.generate(prompts, 1, greedy), local.generate(prompts, 1, greedy)
        assert got.completion_ids == want.completion_ids and got.finish_reason == want.finish_reason
        assert got.texts == want.texts
        for a, b in zip(got.logprobs, want.logprobs):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
        sampling = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, seed=5)
        got, want = engine.generate(prompts, 3, sampling), per_prompt(local, prompts, 3, sampling)
        assert got.completion_ids == want.completion_ids and got.logprobs == want.logprobs
        assert got.truncated_logprobs == want.truncated_logprobs

        reference = TorchEngine(str(nano_model_dir))
        state = {k: v + 0.01 * torch.randn_like(v) for k, v in reference.model.state_dict().items()}
        checksum = weights_checksum(state)
        engine.load_weights(state, 1, checksum)
        reference.load_weights(state, 1, checksum)
        assert [s.app.state.serve.version for s in servers] == [1, 1]
        greedy = dataclasses.replace(greedy, stop=[])
        got = engine.generate(prompts, 1, greedy)
        assert got.completion_ids == reference.generate(prompts, 1, greedy).completion_ids
        assert got.policy_version == [1] * len(prompts)

        # streamed in parts: one safetensors shard each, which the servers read and checksum whole
        state = {k: v + 0.01 * torch.randn_like(v) for k, v in state.items()}
        names = list(state)
        engine.load_buckets(iter([{k: state[k] for k in names[i:i + 5]} for i in range(0, len(names), 5)]), 2)
        reference.load_weights(state, 2, weights_checksum(state))
        parts = -(-len(names) // 5)
        folder = tmp_path / "weights" / "v2"
        assert sorted(p.name for p in folder.glob("*.safetensors"))[-1] == f"model-{parts:05d}-of-{parts:05d}.safetensors"
        assert sorted(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]) == sorted(names)
        assert [s.app.state.serve.version for s in servers] == [2, 2]
        assert engine.generate(prompts, 1, greedy).completion_ids == reference.generate(prompts, 1, greedy).completion_ids

        with pytest.raises(WeightSyncError, match="checksum mismatch") as refused:
            engine.load_weights(state, 3, "f" * 64)
        assert all(s.url in str(refused.value) for s in servers)
        assert engine.version == 2
    finally:
        for s in servers:
            s.stop()


def test_posttrain_eval_through_a_server_equals_the_in_process_eval(nano_model_dir, tmp_path):
    from posttrain.config import load_config
    from posttrain.eval.results import read_samples
    from posttrain.eval.runner import EvalConfig, run_eval

    def evaluate(out, *extra):
        cfg = load_config(EvalConfig, None, [f"model={nano_model_dir}", f"out_dir={out}", "chunk_problems=3",
                                             'benchmarks=[{"kind": "arithmetic", "num_problems": 5}]',
                                             'profiles=[{"name": "greedy", "max_new_tokens": 6}]', *extra])
        results = run_eval(cfg, show_progress=False)
        samples = read_samples(out / "samples" / "arithmetic.greedy.jsonl")
        return results, [(s.completion, s.finish_reason) for s in samples]

    server = real_server(nano_model_dir)
    try:
        remote = evaluate(tmp_path / "remote", "backend=openai", f"urls=['{server.url}']")
    finally:
        server.stop()
    local = evaluate(tmp_path / "local")
    assert remote[1] == local[1] and len(local[1]) == 5
    assert remote[0][0].pass_at_k == local[0][0].pass_at_k


class SleepyDialect(PosttrainDialect):
    """Our dialect plus vLLM's sleep/wake, recording the order of events."""

    def __init__(self, events: list):
        self.events = events

    def sleep(self, client, url):
        self.events.append(("sleep", url))

    def wake(self, client, url):
        self.events.append(("wake", url))

    def push(self, client, url, folder, version, checksum, probe):
        self.events.append(("push", url))
        return super().push(client, url, folder, version, checksum, probe)


def test_servers_sleep_through_the_block_and_wake_before_the_next_push(servers, tmp_path, tokenizer, nano_model_dir):
    events = []
    engine = engine_for(servers, tmp_path, tokenizer, dialect=SleepyDialect(events))
    state = TorchEngine(str(nano_model_dir)).model.state_dict()
    with engine.asleep():
        events.append(("update", None))
    engine.load_weights(state, 1, weights_checksum(state))
    urls = sorted(s.url for s in servers)
    assert sorted(u for e, u in events[:2]) == urls and {e for e, _ in events[:2]} == {"sleep"}
    assert events[2] == ("update", None)
    assert {e for e, _ in events[3:5]} == {"wake"} and {e for e, _ in events[5:]} == {"push"}
    events.clear()
    with pytest.raises(RuntimeError), engine.asleep():  # a failed update still wakes them
        raise RuntimeError("update failed")
    assert [e for e, _ in events] == ["sleep", "sleep", "wake", "wake"]


class AloneDialect(PosttrainDialect):
    """Our dialect, asking for the servers to itself during a push (as vLLM's does with LoRA on)."""

    probe_alone = True

    def __init__(self, spans: list):
        self.spans = spans

    def push(self, client, url, folder, version, checksum, probe):
        start = time.monotonic()
        time.sleep(0.5)
        why = super().push(client, url, folder, version, checksum, probe)
        self.spans.append((start, time.monotonic()))
        return why


def test_a_push_that_needs_the_servers_alone_awaits_requests_sent_and_holds_new_ones(servers, tmp_path, tokenizer,
                                                                                     prompts, nano_model_dir):
    """A request on the wire when the push starts is answered before the push reaches any server,
    and one submitted during the push reaches a server only after the push: no completion overlaps
    a push (a request sent just before a server-side pause would otherwise run beside the probe)."""
    spans = []
    engine = engine_for(servers[:1], tmp_path, tokenizer, dialect=AloneDialect(spans))
    server, state = servers[0], TorchEngine(str(nano_model_dir)).model.state_dict()
    server.delay_s = 1.0
    s = SamplingParams(temperature=0.0, max_new_tokens=2)
    first = engine.submit(prompts[:1], 1, s)
    while not server.events:
        time.sleep(0.01)
    pusher = threading.Thread(target=engine.load_weights, args=(state, 1, weights_checksum(state)))
    pusher.start()
    time.sleep(0.2)
    second = engine.submit(prompts[1:2], 1, s)
    pusher.join()
    got = []
    while len(got) < 2:
        got += engine.poll(wait=True)
    assert sorted(g.rid for g in got) == sorted([first, second])
    (start, end), = spans
    arrive = [t for e, t in server.events if e == "arrive"]
    answer = [t for e, t in server.events if e == "answer"]
    assert answer[0] <= start  # the push waited for the request already sent
    assert arrive[1] >= end  # and held the new one back until it was done
    engine.close()


def test_sleeping_servers_is_refused_without_gpus_and_in_async_mode():
    from posttrain.config import load_config
    from posttrain.errors import UserError
    from posttrain.rl.config import RLConfig

    with pytest.raises(UserError, match="rollout.vllm.sleep_during_update: vLLM's sleep mode needs GPUs"):
        load_config(RLConfig, None, ["rollout.backend=vllm", "rollout.vllm.launch=1",
                                     "rollout.vllm.sleep_during_update=true"])
    with pytest.raises(UserError, match="rollout.vllm.sleep_during_update: sync mode only"):
        load_config(RLConfig, None, ["mode=async", "rollout.backend=vllm", "rollout.urls=[http://h:1]",
                                     "rollout.vllm.sleep_during_update=true"])
