"""Standard-library source as mid-training text, and a tokenizer trained on it."""

from posttrain.models.tiny import build_tokenizer
from posttrain.tasks.python_source import stdlib_documents, stdlib_files


def test_documents_skip_tests_and_keep_to_the_budget(tmp_path):
    for rel, text in {"a.py": "import os\n\n\n\n\nx = 1\n", "pkg/b.py": "def b():\n    return 2\n",
                      "test/test_a.py": "assert False\n", "site-packages/c.py": "c = 3\n", "d.txt": "no\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert sorted(p.name for p in stdlib_files(tmp_path)) == ["a.py", "b.py"]
    docs = stdlib_documents(10_000, tmp_path)
    assert sorted(docs) == ["def b():\n    return 2\n", "import os\n\nx = 1\n"]  # blank runs squeezed
    assert sum(map(len, stdlib_documents(12, tmp_path))) == 12


def test_the_real_library_is_read_in_a_fixed_order():
    docs = stdlib_documents(50_000)
    assert docs == stdlib_documents(50_000) and sum(map(len, docs)) == 50_000
    assert any("def " in d for d in docs)


def test_a_tokenizer_trained_on_code_has_the_asked_vocabulary_and_learns_its_words():
    corpus = ["def total(values):\n    return sum(values)\n"] * 200 + stdlib_documents(100_000)
    tok = build_tokenizer(corpus=corpus, vocab_size=600)
    assert len(tok) == 600  # the special tokens are inside the trained vocabulary
    assert tok.tokenize("    return") == ["ĠĠĠ", "Ġreturn"]
    assert tok.tokenize("def total(values):") == ["def", "Ġtotal", "(", "values", "):"]
    assert tok.decode(tok("def total(values):")["input_ids"]) == "def total(values):"
