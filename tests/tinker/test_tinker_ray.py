"""`posttrain tinker-serve --sampler ray`: two engine replicas as Ray actors (the session's one local
Ray) behind the tinker API, against the in-process TorchEngine sampler of the same snapshot, a
client's sampler checkpoint after training steps (so the snapshot is pushed to both replicas): the
same seeded samples token for token, the same prompt and top-k prompt log-probs; a multi-prompt
call split over both replicas equals the one engine's; bad requests stay 4xx."""

from __future__ import annotations

import argparse
import time

import httpx
import numpy as np
import pytest
import torch

from posttrain.cli import main
from posttrain.rollout.protocol import engine_checksum
from posttrain.rollout.types import weights_checksum
from posttrain.tinker.app import Limits, create_app
from posttrain.tinker.cli import load_base, ray_sampling
from posttrain.tinker.training import merge_adapter
from tests.serve.conftest import RunningServer
from tests.tinker.test_tinker_server import result
from tests.tinker.test_tinker_vllm import PROMPT, base_logprobs, new_client, sample, train

RAY_ARGS = argparse.Namespace(ray_address="", ray_num_cpus=0, ray_replicas=2, ray_replica_cpus=1.0, ray_replica_gpus=0.0)


@pytest.fixture(scope="module")
def servers(ray_cluster, nano_model_dir, tmp_path_factory):
    """One tinker-serve sampling on two Ray replicas and one on the TorchEngine, sharing a checkpoint root."""
    root = tmp_path_factory.mktemp("tinker-ray")
    limits = Limits(max_models=4, max_samples=8, max_new_tokens=32)
    bases = {"ray": load_base("tiny", nano_model_dir, None, ray_sampling(RAY_ARGS, nano_model_dir)),
             "torch": load_base("tiny", nano_model_dir, None)}
    try:
        with RunningServer(create_app({"tiny": bases["ray"]}, root, api_key=None, limits=limits)) as on_ray, \
                RunningServer(create_app({"tiny": bases["torch"]}, root, api_key=None, limits=limits)) as on_torch:
            with httpx.Client(base_url=on_ray.url, timeout=120) as a, httpx.Client(base_url=on_torch.url, timeout=120) as b:
                a.app_state, b.app_state = on_ray.app.state.tinker, on_torch.app.state.tinker
                yield a, b, bases
    finally:
        bases["ray"].sampling.close()


def test_ray_replicas_sample_what_the_torch_engine_samples(servers, nano_model_dir):
    on_ray, on_torch, bases = servers
    model_id = new_client(on_ray)
    train(on_ray, model_id, steps=3)
    path = result(on_ray, on_ray.post("/api/v1/save_weights_for_sampler",
                                      json={"model_id": model_id, "path": "trained"}))["path"]
    sids = [http.post("/api/v1/create_sampling_session", json={"model_path": path}).json()["sampling_session_id"]
            for http in (on_ray, on_torch)]
    engines = bases["ray"].sampling.engine
    before = engines.version
    params = {"max_tokens": 12, "temperature": 1.0, "seed": 11}
    (ray_seqs, ray_prompt, ray_ids, ray_top), (torch_seqs, torch_prompt, torch_ids, torch_top) = [
        sample(http, sid, params, n=4, prompt_logprobs=True, topk=5) for http, sid in zip((on_ray, on_torch), sids)]
    # the snapshot went to both replicas once, each read back the checksum of the merged weights
    merged = merge_adapter(bases["ray"].base_weights, bases["ray"].adapter_state(model_id))
    assert engines.version == before + 1 and sorted(engines.checksums) == [0, 1]
    assert set(engines.checksums.values()) == {engine_checksum(merged, weights_checksum(merged), torch.float32)}
    assert np.abs(base_logprobs(nano_model_dir, PROMPT) - ray_prompt[1:]).max() > 0.05  # trained away from the base
    assert [t for t, _ in ray_seqs] == [t for t, _ in torch_seqs] and len({tuple(t) for t, _ in ray_seqs}) > 1
    for (_, a), (_, b) in zip(ray_seqs, torch_seqs):
        np.testing.assert_allclose(a, b, atol=1e-5)
    print(f"\nRay vs TorchEngine sampler: sample log-probs {max(np.abs(a - b).max() for (_, a), (_, b) in zip(ray_seqs, torch_seqs)):.1e}, "
          f"prompt log-probs {np.abs(ray_prompt[1:] - torch_prompt[1:]).max():.1e}, "
          f"top-5 {np.abs(ray_top[1:] - torch_top[1:]).max():.1e}")
    np.testing.assert_allclose(ray_prompt[1:], torch_prompt[1:], atol=1e-6)
    assert (ray_ids == torch_ids).all()
    np.testing.assert_allclose(ray_top[1:], torch_top[1:], atol=1e-6)
    # a call of several prompts is split over both replicas (per-prompt seeds): the one engine's samples
    prompts = [PROMPT, [3, 4, 5], [9, 8, 7, 6], [2]]
    sample_params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 8, "stop": [], "seed": 5}
    sent = list(engines._sent)
    split, whole = [http.app_state.worker.submit(bases[name].sample_batch, prompts, 3, sample_params, True).result()
                    for http, name in ((on_ray, "ray"), (on_torch, "torch"))]
    assert all(now > then for now, then in zip(engines._sent, sent))  # both replicas took a block
    for (ray_s, ray_p, _), (torch_s, torch_p, _) in zip(split, whole):
        assert [s[1] for s in ray_s] == [s[1] for s in torch_s]
        for a, b in zip(ray_s, torch_s):
            np.testing.assert_allclose(a[2], b[2], atol=1e-5)
        np.testing.assert_allclose(ray_p[1:], torch_p[1:], atol=1e-6)


def test_bad_requests_stay_4xx_on_the_ray_sampler(servers):
    on_ray, _, _ = servers
    sid = on_ray.post("/api/v1/create_sampling_session", json={"base_model": "tiny"}).json()["sampling_session_id"]
    prompt = {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]}
    for body, status, words in [({"sampling_params": {"max_tokens": 33}}, 400, "max_tokens"),
                                ({"sampling_params": {"max_tokens": 2}, "topk_prompt_logprobs": 21}, 400, "0..20"),
                                ({"sampling_params": {"max_tokens": 2}, "sampling_session_id": "nope"}, 404, "no such sampler")]:
        r = on_ray.post("/api/v1/asample", json={"sampling_session_id": sid, "prompt": prompt} | body)
        assert r.status_code == status and words in r.json()["error"]["message"], r.text
    seqs, _ = sample(on_ray, sid, {"max_tokens": 3, "seed": 1})  # and the sampler still serves
    assert len(seqs) == 1 and len(seqs[0][0]) == 3


def test_ray_sampler_flags_checked_before_anything_starts(tmp_path, capsys):
    serve = ["tinker-serve", "--root", str(tmp_path), "--port", "0", "--sampler", "ray"]
    for extra, words in [(["--ray-replicas", "0"], "--ray-replicas=0: must be >= 1"),
                         (["--ray-replica-cpus", "0"], "--ray-replica-cpus must be > 0")]:
        assert main(serve + extra) == 2
        assert words in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_tinker_server_imports_ray_only_for_the_ray_sampler():
    import subprocess
    import sys

    code = ("import sys; from posttrain.tinker import app, cli, samplers, training; "
            "from posttrain.distributed import engines; assert 'ray' not in sys.modules, 'ray imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.slow
def test_two_ranks_sample_on_ray_replicas(ray_cluster, nano_model_dir, tmp_path):
    """`torchrun --nproc-per-node 2 ... --sampler ray` joined to the session's Ray: rank 0 merges the
    snapshot from its whole copy of the base into one replica; the samples' log-probs are the
    sharded trainer's."""
    import httpx

    from tests.tinker.test_tinker_ranks import Ranks
    from tests.tinker.test_tinker_vllm import trainer_logprobs

    address = ray_cluster.get_runtime_context().gcs_address
    free = ray_cluster.available_resources().get("CPU", 0)
    ranks = Ranks(tmp_path, nano_model_dir, name="tiny", flags=["--sampler", "ray", "--ray-address", address])
    try:
        with httpx.Client(base_url=ranks.url(), timeout=120) as http:
            model_id = new_client(http)
            train(http, model_id, steps=2)
            sid = result(http, http.post("/api/v1/save_weights_for_sampler", json={"model_id": model_id}))["sampling_session_id"]
            seqs, prompt_lp = sample(http, sid, {"max_tokens": 8, "temperature": 1.0, "seed": 3}, n=3, prompt_logprobs=True)
            gap = max(float(np.abs(trainer_logprobs(http, model_id, PROMPT + t)[len(PROMPT) - 1:] - lp).max())
                      for t, lp in seqs)
            gap = max(gap, float(np.abs(trainer_logprobs(http, model_id, PROMPT) - prompt_lp[1:]).max()))
            from_base = float(np.abs(base_logprobs(nano_model_dir, PROMPT) - prompt_lp[1:]).max())
            print(f"\nRay sampler vs 2-rank trainer log-prob gap: {gap:.2e} (vs the base: {from_base:.2f})")
            assert gap < 1e-4, gap
            assert from_base > 0.05, from_base  # the trained snapshot is what the replica holds
            assert ranks.proc.poll() is None and len(ranks.ranks()) == 2
    finally:
        ranks.kill()
    for _ in range(100):  # the replica left the session's Ray with the server
        if ray_cluster.available_resources().get("CPU", 0) == free:
            break
        time.sleep(0.1)
    assert ray_cluster.available_resources().get("CPU", 0) == free
