"""POST /update_weights_from_disk: new weights change generations and the version; refused ones change nothing."""

from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import save_file

from posttrain.rollout import SamplingParams, weights_checksum
from posttrain.serve.weights import folder_checksum, load_folder

PROMPTS = [[290, 30, 225, 21, 22], [40, 41, 42], [100, 101]]


def perturbed_folder(src, dst, seed: int, rename: bool = False):
    tensors = load_folder(src)
    g = torch.Generator().manual_seed(seed)
    out = {k: (v + 0.3 * torch.randn(v.shape, generator=g)).contiguous() for k, v in tensors.items()}
    if rename:
        out["model.not_a_layer.weight"] = out.pop("lm_head.weight")
    dst.mkdir(parents=True, exist_ok=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst, out


def greedy(http, prompts=PROMPTS, max_tokens=10):
    r = http.post("/v1/completions", json={"prompt": prompts, "max_tokens": max_tokens, "temperature": 0,
                                           "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"]


def update(http, **body):
    return http.post("/update_weights_from_disk", json=body)


@pytest.fixture(scope="module")
def folders(nano_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    return {name: perturbed_folder(nano_model_dir, root / name, seed, rename=(name == "renamed"))
            for name, seed in [("v1", 1), ("other", 2), ("renamed", 3), ("v3", 4)]}


def test_update_changes_generations_and_version(server, http, folders, reference_engine, nano_model_dir):
    before = greedy(http)
    assert http.get("/get_model_info").json()["checksum"] == folder_checksum(nano_model_dir)
    folder, tensors = folders["v1"]
    checksum = weights_checksum(tensors)
    r = update(http, model_path=str(folder), load_format="safetensors", version=1, checksum=checksum)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["version"] == 1 and body["checksum"] == checksum and body["message"]
    assert http.get("/health").json() == {"status": "ok", "version": 1}
    info = http.get("/get_model_info").json()
    assert info["version"] == 1 and info["checksum"] == checksum and info["model_path"] == str(folder)

    after = greedy(http)
    assert [c["token_ids"] for c in after] != [c["token_ids"] for c in before]
    assert {c["policy_version"] for c in after} == {1}
    reference_engine.load_weights(tensors, 1, checksum)
    ref = reference_engine.generate(PROMPTS, 1, SamplingParams(temperature=0.0, max_new_tokens=10))
    assert [c["token_ids"] for c in after] == ref.completion_ids


def test_bad_checksum_is_refused_and_old_weights_stay(http, folders):
    before, info = greedy(http), http.get("/get_model_info").json()
    folder, _ = folders["other"]
    r = update(http, model_path=str(folder), version=2, checksum="0" * 64)
    assert r.status_code == 400
    body = r.json()
    assert body["success"] is False and "checksum" in body["message"] and body["error"]["param"] == "checksum"
    assert http.get("/health").json()["version"] == 1
    assert http.get("/get_model_info").json() == info
    assert greedy(http) == before


def test_an_older_version_is_refused_unless_the_server_allows_a_restart(folders, nano_model_dir):
    """A replayed old request must not roll the policy back (409); a server started with
    --allow-version-rollback takes a new or resumed run's restarted count."""
    import tempfile
    from pathlib import Path

    import httpx

    from posttrain.serve.app import Access
    from tests.serve.conftest import make_server

    folder, tensors = folders["other"]
    body = dict(model_path=str(folder), checksum=weights_checksum(tensors))
    for allowed in (False, True):
        access = Access(weights_root=Path(tempfile.gettempdir()), allow_version_rollback=allowed)
        with make_server(nano_model_dir, access=access) as s, httpx.Client(base_url=s.url, timeout=60) as http:
            assert update(http, **body, version=7).status_code == 200
            r = update(http, **body, version=0)
            assert r.status_code == (200 if allowed else 409) and r.json()["success"] is allowed
            assert http.get("/health").json()["version"] == (0 if allowed else 7)


@pytest.mark.parametrize("case", ["unknown_names", "no_safetensors", "run_dir_without_checkpoint"])
def test_other_refusals_leave_weights_alone(http, folders, tmp_path, case):
    before, info = greedy(http), http.get("/get_model_info").json()
    if case == "unknown_names":
        folder, _ = folders["renamed"]
        r = update(http, model_path=str(folder), version=5)
    elif case == "no_safetensors":
        r = update(http, model_path=str(tmp_path))
    else:
        (tmp_path / "checkpoints").mkdir()
        r = update(http, model_path=str(tmp_path))
    assert r.status_code == 400 and r.json()["success"] is False, r.text
    assert http.get("/get_model_info").json() == info
    assert greedy(http) == before


def test_sglang_style_body_default_version_and_run_dir(http, folders, tmp_path):
    folder, tensors = folders["v3"]
    previous = http.get("/health").json()["version"]
    r = update(http, model_path=str(folder), load_format="auto", flush_cache=True, abort_all_requests=False)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == previous + 1 and r.json()["checksum"] == weights_checksum(tensors)

    run = tmp_path / "run"
    for step in (4, 7):
        ckpt = run / "checkpoints" / f"step-{step}"
        ckpt.mkdir(parents=True)
        save_file(load_folder(folders["v1" if step == 7 else "other"][0]), str(ckpt / "model.safetensors"))
        (ckpt / "trainer_state.pt").write_bytes(b"")
    (run / "checkpoints" / "step-9.tmp").mkdir()  # a save killed half-way: skipped
    r = update(http, model_path=str(run), weight_version="7")
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 7 and r.json()["checksum"] == weights_checksum(folders["v1"][1])
    assert http.get("/get_model_info").json()["model_path"] == str(run / "checkpoints" / "step-7")


def test_update_between_generations_never_mid_batch(server, http, folders, reference_engine):
    """Generations racing an update each run wholly on one version and match that version's outputs."""
    import httpx

    expected = {}
    for version, name in [(8, "other"), (9, "v3")]:
        tensors = folders[name][1]
        reference_engine.load_weights(tensors, version, weights_checksum(tensors))
        expected[version] = reference_engine.generate(PROMPTS, 1, SamplingParams(temperature=0.0,
                                                                                 max_new_tokens=10)).completion_ids
    assert update(http, model_path=str(folders["other"][0]), version=8).status_code == 200

    async def race():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            gens = [client.post("/v1/completions", json={"prompt": PROMPTS, "max_tokens": 10, "temperature": 0,
                                                          "return_token_ids": True}) for _ in range(12)]
            upd = client.post("/update_weights_from_disk", json={"model_path": str(folders["v3"][0]), "version": 9})
            return await asyncio.gather(*gens[:6], upd, *gens[6:])

    responses = asyncio.run(race())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    seen = set()
    for r in responses[:6] + responses[7:]:
        choices = r.json()["choices"]
        versions = {c["policy_version"] for c in choices}
        assert len(versions) == 1
        version = versions.pop()
        seen.add(version)
        assert [c["token_ids"] for c in choices] == expected[version]
    assert seen <= {8, 9} and http.get("/health").json()["version"] == 9
