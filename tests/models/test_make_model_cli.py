"""`posttrain make-model NAME DIR`: finds the GGUF inside its installed package without importing it;
a package that is not installed is one line saying how to install it, exit 2."""

from __future__ import annotations

from posttrain.cli import main
from posttrain.models import gguf


def test_make_model_without_the_package_says_how_to_get_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(gguf.MODELS, "smollm2-135m-instruct", ("no_such_pkg_for_posttrain", "m.gguf", "no-such-pkg"))
    assert main(["make-model", "smollm2-135m-instruct", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the no-such-pkg package is not installed" in err
    assert "bash scripts/setup.sh smollm2" in err and not (tmp_path / "out").exists()


def test_make_model_finds_the_file_in_the_package_folder(monkeypatch, tmp_path):
    pkg = tmp_path / "site" / "fake_model_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('its own dependencies are not installed')\n")
    (pkg / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(gguf.MODELS, "fake", ("fake_model_pkg", "m.gguf", "fake-model-pkg"))
    assert gguf.packaged_gguf("fake") == pkg / "m.gguf"
