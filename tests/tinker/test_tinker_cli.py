"""`posttrain tinker-serve --model NAME=PATH`: PATH a model folder or a GGUF file, which is read
through the one cached conversion every command uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.errors import UserError
from posttrain.models import gguf
from posttrain.tinker.cli import _models


def test_a_gguf_model_is_served_from_its_cached_conversion(nano_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.models.gguf_writer import write_gguf

    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    model, tok = AutoModelForCausalLM.from_pretrained(nano_model_dir), AutoTokenizer.from_pretrained(nano_model_dir)
    path = write_gguf(model, tok, nano_model_dir, tmp_path / "nano.gguf")
    models = _models([f"nano={path}"], tmp_path)
    assert models == {"nano": Path(gguf.cached_folder(str(path)))}
    assert (models["nano"] / "config.json").is_file()


def test_a_missing_gguf_model_is_one_line_naming_the_flag(tmp_path):
    with pytest.raises(UserError, match=r"^--model=nano=\S*m\.gguf: GGUF file does not exist$") as e:
        _models([f"nano={tmp_path / 'm.gguf'}"], tmp_path)
    assert "\n" not in str(e.value)
