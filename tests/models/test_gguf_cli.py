"""`posttrain convert-gguf FILE DIR`: writes a loadable folder; bad input is one line, exit 2."""

from __future__ import annotations

import pytest

from posttrain.cli import main

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_file(nano_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.models.gguf_writer import write_gguf

    model = AutoModelForCausalLM.from_pretrained(nano_model_dir)
    tok = AutoTokenizer.from_pretrained(nano_model_dir)
    return write_gguf(model, tok, nano_model_dir, tmp_path_factory.mktemp("g") / "nano.gguf", tied=True)


def test_convert_gguf_writes_a_folder(gguf_file, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["convert-gguf", str(gguf_file), str(tmp_path / "out")]) == 0
    assert f"wrote {tmp_path / 'out'}" in capsys.readouterr().out
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.tie_word_embeddings is True
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template
    assert not [p for p in tmp_path.iterdir() if p.name != "out"]  # the temporary folder was renamed


@pytest.mark.parametrize("case", ["missing", "not_gguf", "dir_not_empty"])
def test_convert_gguf_bad_input_exits_2(case, gguf_file, tmp_path, capsys):
    src, out = str(gguf_file), tmp_path / "out"
    if case == "missing":
        src = str(tmp_path / "nope.gguf")
    elif case == "not_gguf":
        (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04 a zip")
        src = str(tmp_path / "x.gguf")
    else:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    assert main(["convert-gguf", src, str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert {"missing": f"FILE={src}: GGUF file does not exist", "not_gguf": f"FILE={src}: not a GGUF file",
            "dir_not_empty": f"DIR={out}: exists and is not an empty folder"}[case] in err
    if case == "dir_not_empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
