"""Every rollout engine takes new weights through the one call, `RolloutEngine.load_version`
(buckets, version, digest, optional probe): the in-process `TorchEngine`, `HTTPEngine` against a
loopback ``posttrain serve`` (spoken to as our server and as SGLang), the in-process and the
process engine handles of async RL, and Ray replicas fed either way. The same buckets make each one
sample what a `TorchEngine` holding those weights samples, and weights the sender's digest or
probe contradicts are refused by each."""

from __future__ import annotations

import contextlib
import inspect

import pytest
import torch

from posttrain.rollout import HTTPEngine, RolloutEngine, SamplingParams, TorchEngine, WeightSyncError, weights_checksum
from posttrain.rollout.http import model_eos_ids
from posttrain.rollout.types import WeightsDigest
from tests.rollout.test_http_engine import real_server

TEXTS = ["Compute 12 x 34.", "Hello", "The answer is"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
KINDS = ["torch", "http", "http-sglang", "local", "process", "ray-stream", "ray-store"]


@pytest.fixture(scope="module")
def reference(nano_model_dir):
    """A `TorchEngine` holding the new weights, and those weights."""
    engine = TorchEngine(str(nano_model_dir))
    g = torch.Generator().manual_seed(0)
    weights = {k: v + 0.02 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
               for k, v in engine.model.state_dict().items()}
    engine.load_weights(weights, 1, weights_checksum(weights))
    return engine, weights


@pytest.fixture(scope="module")
def prompts(reference):
    return [reference[0].tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


@contextlib.contextmanager
def engine_of(kind: str, path: str, tmp_path, request):
    if kind == "torch":
        yield TorchEngine(path)
    elif kind.startswith("http"):
        from posttrain.rollout.sglang import SGLangDialect

        server = real_server(path)
        tok = TorchEngine(path).tokenizer
        dialect = SGLangDialect() if kind == "http-sglang" else None
        engine = HTTPEngine([server.url], weights_dir=str(tmp_path / "w"), tokenizer=tok,
                            eos_ids=model_eos_ids(path, tok), dialect=dialect)
        try:
            yield engine
        finally:
            engine.close()
            server.stop()
    elif kind == "local":
        from posttrain.rl.async_.worker import LocalEngine

        yield LocalEngine(TorchEngine(path))
    elif kind == "process":
        from posttrain.rl.async_.worker import ProcessEngine

        engine = ProcessEngine(path, threads=1, timeout_s=120)
        try:
            yield engine
        finally:
            engine.close()
    else:
        from posttrain.distributed.engines import RayEngines, ReplicaSpec

        request.getfixturevalue("ray_cluster")
        engine = RayEngines(ReplicaSpec(path=path), 1, request_timeout_s=120, sync_timeout_s=120,
                            stream_weights=kind == "ray-stream")
        try:
            yield engine
        finally:
            engine.close()


def hand(engine, weights: dict, version: int, probe, digest=None) -> None:
    """What the RL loop does: the buckets digested on their way, the digest asked for after them."""
    names, sent = sorted(weights), WeightsDigest()

    def buckets():
        for i in range(0, len(names), 7):
            bucket = {k: weights[k] for k in names[i:i + 7]}
            sent.update(bucket)
            yield bucket

    engine.load_version(buckets(), version, digest or sent.hexdigest, probe)
    getattr(engine, "wait_synced", lambda: None)()  # the handles of async RL acknowledge later


def probe_of(model, ids: list[int]) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)
    return ids, [lp[i, t].item() for i, t in enumerate(ids[1:])]


def test_the_one_call_has_one_signature():
    from posttrain.distributed.engines import RayEngines
    from posttrain.rl.async_.worker import LocalEngine, ProcessEngine

    want = inspect.signature(RolloutEngine.load_version)
    for cls in (TorchEngine, HTTPEngine, RayEngines, ProcessEngine, LocalEngine):
        got = inspect.signature(cls.load_version)
        assert list(got.parameters) == list(want.parameters), cls
        assert got.parameters["probe"].default is None, cls


@pytest.mark.parametrize("kind", KINDS)
def test_every_engine_takes_the_same_buckets_through_the_one_call(kind, reference, prompts, nano_model_dir,
                                                                    tmp_path, request):
    want_engine, weights = reference
    probe = probe_of(want_engine.model, prompts[0] + prompts[1])
    want = want_engine.generate(prompts, 1, GREEDY).completion_ids
    with engine_of(kind, str(nano_model_dir), tmp_path, request) as engine:
        assert isinstance(engine, RolloutEngine)
        before = engine.generate(prompts, 1, GREEDY).completion_ids
        hand(engine, weights, 1, probe)
        assert engine.version == 1
        assert engine.generate(prompts, 1, GREEDY).completion_ids == want != before
        if kind == "http":  # the server hashed the files it read: the sender's digest
            assert engine.urls and real_digest(engine) == weights_checksum(weights)
        wrong_probe = (probe[0], [x - 1.0 for x in probe[1]])
        with pytest.raises(WeightSyncError):  # our server and the engines check the digest, SGLang the probe
            hand(engine, weights, 2, wrong_probe, digest=lambda: "0" * 32)


def real_digest(engine: HTTPEngine) -> str:
    import httpx

    return httpx.get(f"{engine.urls[0]}/model_info").json()["checksum"]
