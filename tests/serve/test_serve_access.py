"""Who may use `posttrain serve` and what a reload may load: the API key on every route but
/health, reloads only from inside the weights root, whole state dicts only, and the client's key."""

from __future__ import annotations

import os

import httpx
import pytest
import torch
from safetensors.torch import save_file

from posttrain.rollout import HTTPEngine, SamplingParams, weights_checksum
from posttrain.serve.app import Access
from posttrain.serve.weights import load_folder
from tests.serve.conftest import make_server

KEY = "s3cret-key"
PROMPT = {"prompt": [[40, 41, 42]], "max_tokens": 8, "temperature": 0, "return_token_ids": True}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("weights-root")


@pytest.fixture(scope="module")
def keyed(nano_model_dir, root):
    with make_server(nano_model_dir, access=Access(api_key=KEY, weights_root=root)) as s:
        yield s


def write(folder, tensors):
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def zeroed(nano_model_dir):
    return {k: torch.zeros_like(v) for k, v in load_folder(nano_model_dir).items()}


def tokens(client):
    r = client.post("/v1/completions", json=PROMPT)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


@pytest.fixture
def authed(keyed):
    with httpx.Client(base_url=keyed.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_without_the_key_nothing_but_health_answers_and_a_reload_changes_nothing(keyed, authed, nano_model_dir, root,
                                                                                   headers):
    before = tokens(authed)
    folder = write(root / "zeroed", zeroed(nano_model_dir))
    with httpx.Client(base_url=keyed.url, timeout=60, headers=headers) as anon:
        assert anon.get("/health").status_code == 200
        for method, path, body in [("GET", "/v1/models", None), ("POST", "/v1/completions", PROMPT),
                                   ("POST", "/update_weights_from_disk", {"model_path": str(folder), "version": 1})]:
            r = anon.request(method, path, json=body)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
            assert r.headers["www-authenticate"] == "Bearer"
    assert tokens(authed) == before and authed.get("/health").json()["version"] == 0


def test_with_the_key_a_reload_inside_the_root_works(keyed, authed, nano_model_dir, root):
    tensors = {k: v + 0.3 for k, v in load_folder(nano_model_dir).items()}
    folder = write(root / "moved", tensors)
    before = tokens(authed)
    r = authed.post("/update_weights_from_disk", json={"model_path": str(folder), "version": 3,
                                                        "checksum": weights_checksum(tensors)})
    assert r.status_code == 200 and r.json()["version"] == 3
    assert tokens(authed) != before


@pytest.mark.parametrize("where", ["outside", "dotdot", "symlink"])
def test_reloads_from_outside_the_weights_root_are_403(authed, nano_model_dir, root, tmp_path, where):
    outside = write(tmp_path / "elsewhere", zeroed(nano_model_dir))
    path = {"outside": str(outside), "dotdot": f"{root}/../{outside.relative_to(root.parent)}" if
            outside.is_relative_to(root.parent) else f"{root}/../../{outside}"}.get(where)
    if where == "symlink":
        link = root / f"link-{os.getpid()}"
        if not link.exists():
            link.symlink_to(outside, target_is_directory=True)
        path = str(link)
    info = authed.get("/get_model_info").json()
    r = authed.post("/update_weights_from_disk", json={"model_path": path, "version": 99})
    assert r.status_code == 403 and r.json()["success"] is False, r.text
    assert authed.get("/get_model_info").json() == info


def test_a_weight_file_linked_from_outside_the_root_is_403(authed, nano_model_dir, root, tmp_path):
    """The folder lies inside the root, but its safetensors file is a link to one outside it."""
    outside = write(tmp_path / "elsewhere", zeroed(nano_model_dir))
    folder = root / f"linked-file-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    if not (folder / "model.safetensors").exists():
        (folder / "model.safetensors").symlink_to(outside / "model.safetensors")
    before, info = tokens(authed), authed.get("/get_model_info").json()
    r = authed.post("/update_weights_from_disk", json={"model_path": str(folder), "version": 99})
    assert r.status_code == 403 and "outside the weights root" in r.json()["message"], r.text
    assert tokens(authed) == before and authed.get("/get_model_info").json() == info


def _spoiled(tensors: dict, how: str) -> dict:
    name = "lm_head.weight"
    if how == "missing":
        tensors.pop(name)
    elif how == "unexpected":
        tensors["model.extra.weight"] = torch.zeros(2, 2)
    elif how == "shape":
        tensors[name] = tensors[name][:-1]
    else:  # a float weight sent as integers: cast, it would load as garbage
        tensors[name] = tensors[name].to(torch.int32)
    return tensors


@pytest.mark.parametrize("how,code", [("missing", "partial_weights"), ("unexpected", "weight_mismatch"),
                                      ("shape", "weight_mismatch"), ("dtype", "weight_mismatch")])
def test_a_partial_or_mismatched_state_dict_is_refused_and_the_model_kept(authed, nano_model_dir, root, how, code):
    folder = write(root / f"spoiled-{how}", _spoiled(zeroed(nano_model_dir), how))
    before, info = tokens(authed), authed.get("/get_model_info").json()
    r = authed.post("/update_weights_from_disk", json={"model_path": str(folder)})  # the next version
    assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    assert "lm_head.weight" in r.json()["message"] or "model.extra.weight" in r.json()["message"]
    assert tokens(authed) == before and authed.get("/get_model_info").json() == info


def test_a_version_once_loaded_is_not_reloaded_with_other_weights(nano_model_dir, tmp_path):
    """A reload at the loaded version is a replay (same weights: 200, nothing changes) or a 409: a
    version names one set of weights. The starting weights at version 0 are the exception: a run's
    first sync confirms them at version 0, as the trainer exports them."""
    base = load_folder(nano_model_dir)
    a = write(tmp_path / "a", {k: v + 0.1 for k, v in base.items()})
    b = write(tmp_path / "b", {k: v - 0.1 for k, v in base.items()})
    with make_server(nano_model_dir, access=Access(weights_root=tmp_path)) as s, \
            httpx.Client(base_url=s.url, timeout=60) as c:
        def reload(folder, version):
            return c.post("/update_weights_from_disk", json={"model_path": str(folder), "version": version})

        assert reload(b, 0).status_code == 200  # the starting weights, re-sent by a trainer
        assert reload(a, 0).status_code == 409  # ... but only once: version 0 now names b's weights
        assert reload(a, 5).status_code == 200
        at_5, info = tokens(c), c.get("/get_model_info").json()
        r = reload(b, 5)
        assert r.status_code == 409 and r.json()["error"]["code"] == "version_reused", r.text
        assert tokens(c) == at_5 and c.get("/get_model_info").json() == info
        assert reload(a, 5).status_code == 200 and tokens(c) == at_5  # a replay of what is loaded


def test_without_a_weights_root_reloads_are_refused(nano_model_dir, tmp_path):
    folder = write(tmp_path / "w", zeroed(nano_model_dir))
    with make_server(nano_model_dir, access=Access()) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.post("/update_weights_from_disk", json={"model_path": str(folder), "version": 1})
        assert r.status_code == 403 and "--weights-root" in r.json()["message"]


def test_the_http_engine_sends_the_key(keyed, nano_model_dir, root, monkeypatch):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(nano_model_dir)
    monkeypatch.delenv("POSTTRAIN_API_KEY", raising=False)
    keyless = HTTPEngine([keyed.url], weights_dir=str(root / "engine"), tokenizer=tok, retries=0)
    assert keyless.generate([[40, 41]], 1, SamplingParams(temperature=0.0, max_new_tokens=2)).finish_reason == ["error"]
    monkeypatch.setenv("POSTTRAIN_API_KEY", KEY)
    engine = HTTPEngine([keyed.url], weights_dir=str(root / "engine"), tokenizer=tok)
    tensors = load_folder(nano_model_dir)
    engine.load_weights(tensors, 100, weights_checksum(tensors))
    assert engine.version == 100
    ro = engine.generate([[40, 41]], 1, SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True))
    assert len(ro.completion_ids[0]) == 4 and ro.finish_reason[0] != "error"
