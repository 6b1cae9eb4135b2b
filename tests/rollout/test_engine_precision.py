"""``rollout.precision_fallback`` asks every engine kind for another dtype the same way: the
``dtype`` of `RolloutEngine.load_version`. Each kind posttrain runs (in process, our server over
HTTP, the async handles, Ray replicas streamed or fed through the object store) is switched to
bfloat16 and back to float32 by two loads, and samples what a `TorchEngine` built in that dtype
samples from the same weights: the same tokens, and log-probs that match that dtype's reference
far more closely than the other's."""

from __future__ import annotations

import pytest
import torch

from posttrain.rollout import SamplingParams, TorchEngine
from posttrain.rollout.types import WeightsDigest
from tests.rollout.test_engine_protocol import engine_of, prompts, reference  # noqa: F401 - fixtures

SAMPLE = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
KINDS = ["torch", "http", "local", "process", "ray-stream", "ray-store"]


@pytest.fixture(scope="module")
def references(reference, nano_model_dir):  # noqa: F811
    """The new weights held by a float32 and by a bfloat16 `TorchEngine`."""
    f32, weights = reference
    bf16 = TorchEngine(str(nano_model_dir), dtype=torch.bfloat16)
    bf16.load_weights(weights, 1, f32_checksum(weights))
    return {"float32": f32, "bfloat16": bf16}, weights


def f32_checksum(weights: dict) -> str:
    digest = WeightsDigest()
    digest.update(weights)
    return digest.hexdigest()


def load(engine, weights: dict, version: int, dtype: str) -> None:
    sent = WeightsDigest()

    def buckets():  # a fresh dict: a streaming sender empties the buckets it sends
        sent.update(weights)
        yield dict(weights)

    engine.load_version(buckets(), version, sent.hexdigest, None, dtype=dtype)
    getattr(engine, "wait_synced", lambda: None)()


def flat(rollouts) -> list[float]:
    return [x for row in rollouts.logprobs for x in row]


@pytest.mark.parametrize("kind", KINDS)
def test_each_engine_kind_switches_dtype_through_the_load(kind, references, prompts, nano_model_dir,  # noqa: F811
                                                          tmp_path, request):
    refs, weights = references
    want = {d: e.generate(prompts, 1, SAMPLE) for d, e in refs.items()}
    gap = max(abs(a - b) for a, b in zip(flat(want["float32"]), flat(want["bfloat16"])))
    assert gap > 1e-3  # the two precisions are told apart by their log-probs
    with engine_of(kind, str(nano_model_dir), tmp_path, request) as engine:
        for version, dtype in ((1, "bfloat16"), (2, "float32"), (3, "bfloat16")):
            load(engine, weights, version, dtype)
            got = engine.generate(prompts, 1, SAMPLE)
            assert got.completion_ids == want[dtype].completion_ids, (version, dtype)
            err = max(abs(a - b) for a, b in zip(flat(got), flat(want[dtype])))
            assert err < gap / 20, (version, dtype, err, gap)
        if kind == "http":  # the server says what it holds
            import httpx

            assert httpx.get(f"{engine.urls[0]}/model_info").json()["dtype"] == "bfloat16"


def test_a_server_refuses_an_unknown_dtype_with_a_400(reference, nano_model_dir, tmp_path):  # noqa: F811
    import httpx

    from posttrain.rollout.weights_folder import write_version
    from tests.rollout.test_http_engine import real_server

    _, weights = reference
    server = real_server(str(nano_model_dir))
    try:
        folder, checksum = write_version(tmp_path / "w", [weights], 1, WeightsDigest())
        r = httpx.post(f"{server.url}/update_weights_from_disk",
                       json={"model_path": str(folder), "version": 1, "checksum": checksum, "dtype": "int8"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "dtype"
        assert "choose from float32" in r.json()["message"]
        assert httpx.get(f"{server.url}/model_info").json()["version"] == 0  # nothing loaded
    finally:
        server.stop()
