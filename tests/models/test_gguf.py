"""GGUF files as model folders: a tiny Llama written as llama.cpp lays it out converts back to the
same logits and tokenizer, a `.gguf` model.path loads through one cached conversion, and bad files
are one-line errors naming the setting."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.errors import UserError
from posttrain.models import gguf
from posttrain.models.hf import ModelConfig, load_model, load_tokenizer

pytest.importorskip("gguf")

TEXT = "<|im_start|>user\nwrite def f(x): return 417 * x<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def source(nano_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(nano_model_dir).eval(), AutoTokenizer.from_pretrained(nano_model_dir)


@pytest.fixture(scope="module")
def gguf_files(source, nano_model_dir, tmp_path_factory):
    from tests.models.gguf_writer import write_gguf

    d = tmp_path_factory.mktemp("gguf")
    model, tok = source
    return {tied: write_gguf(model, tok, nano_model_dir, d / f"nano-{'tied' if tied else 'untied'}.gguf", tied=tied)
            for tied in (False, True)}


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_convert_gives_the_same_model_and_tokenizer(source, gguf_files, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = source
    out = gguf.convert_gguf(str(gguf_files[False]), tmp_path / "out")
    converted, ctok = AutoModelForCausalLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
    ids = tok(TEXT)["input_ids"]
    assert ctok(TEXT)["input_ids"] == ids
    assert ctok.chat_template == tok.chat_template
    assert converted.dtype == torch.float32
    assert torch.equal(_logits(converted, ids), _logits(model, ids))  # q/k un-permuted, nothing rounded
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is False
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tok.eos_token_id
    note = json.loads((out / gguf.SOURCE_NOTE).read_text())
    assert note["source"] == str(gguf_files[False].resolve()) and note["gguf_tensor_types"] == ["F32"]
    assert note["dequantised"] is False and note["saved_dtype"] == "float32"


def test_tied_gguf_keeps_lm_head_tied_to_the_embedding(source, gguf_files, tmp_path):
    from transformers import AutoModelForCausalLM

    out = gguf.convert_gguf(str(gguf_files[True]), tmp_path / "tied")
    converted = AutoModelForCausalLM.from_pretrained(out)
    assert converted.config.tie_word_embeddings is True
    assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()
    assert torch.equal(converted.model.embed_tokens.weight, source[0].model.embed_tokens.weight)


def test_gguf_model_path_converts_once_into_the_cache(source, gguf_files, tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    calls = []
    convert = gguf.convert_gguf
    monkeypatch.setattr(gguf, "convert_gguf", lambda *a, **k: calls.append(a) or convert(*a, **k))
    path = str(gguf_files[False])
    first = load_model(ModelConfig(path=path), trainable=False)
    tok = load_tokenizer(path)
    second = load_model(ModelConfig(path=path), trainable=False)
    assert len(calls) == 1
    ids = source[1](TEXT)["input_ids"]
    assert tok(TEXT)["input_ids"] == ids
    assert torch.equal(_logits(first, ids), _logits(source[0], ids))
    assert torch.equal(_logits(second, ids), _logits(source[0], ids))
    folders = list((tmp_path / "cache" / "gguf").iterdir())
    assert [f.name.startswith("nano-untied-") for f in folders] == [True]  # no temporary folder left


def test_gguf_cache_key_follows_the_file(gguf_files, tmp_path):
    import os
    import shutil

    copy = tmp_path / "m.gguf"
    shutil.copy(gguf_files[False], copy)
    before = gguf.cache_key(copy.resolve())
    os.utime(copy, ns=(0, 10**9))  # a rewritten file: a new conversion, not the stale one
    assert gguf.cache_key(copy.resolve()) != before


def test_every_engine_reads_the_one_cached_conversion(source, gguf_files, nano_model_dir, tmp_path, monkeypatch):
    """rl's engine (in-process and the async engine process), eval's and serve's take a `.gguf`
    path through the cache the trainer loads from: converted once, never again, never re-read raw."""
    from posttrain.core.dist import World
    from posttrain.config import load_config
    from posttrain.eval.runner import resolve_model
    from posttrain.rl.async_ import run as async_run
    from posttrain.rl.config import RLConfig
    from posttrain.rl.engines import build_engine
    from posttrain.rollout import SamplingParams, TorchEngine
    from posttrain.serve.app import load_engine

    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    path = str(gguf_files[False])
    folder = gguf.cached_folder(path)  # the first use converts

    def convert_again(*args, **kwargs):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(gguf, "convert_gguf", convert_again)
    tok = load_tokenizer(path)
    cfg = load_config(RLConfig, None, [f"model.path={path}", "data.path=unused.jsonl"])
    rl_engine = build_engine(cfg, tok, World())
    monkeypatch.setattr(async_run, "ProcessEngine", lambda model, **kwargs: model)
    assert async_run.start_engine(cfg, tok) == folder
    assert resolve_model(path) == (folder, None)
    serve_engine = load_engine(path)[0]
    assert rl_engine.model.name_or_path == serve_engine.model.name_or_path == folder
    ids = source[1](TEXT)["input_ids"]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)
    from_folder = TorchEngine(str(nano_model_dir)).generate([ids], 2, params)
    for engine in (rl_engine, serve_engine):
        got = engine.generate([ids], 2, params)
        assert got.completion_ids == from_folder.completion_ids and got.logprobs == from_folder.logprobs
    with pytest.raises(ValueError, match="a GGUF file"):
        TorchEngine(path)  # the engine alone never dequantises a file again


@pytest.mark.parametrize("kind", ["missing", "not_gguf"])
def test_bad_gguf_path_is_one_line_naming_the_key(kind, tmp_path):
    path = tmp_path / "m.gguf"
    if kind == "not_gguf":
        path.write_text('{"not": "a model"}')
    with pytest.raises(UserError, match=r"^model\.path=.*m\.gguf: (GGUF file does not exist|not a GGUF file)") as e:
        load_model(ModelConfig(path=str(path)))
    assert "\n" not in str(e.value)
