"""Fixtures for the data tests: the embedded nano tokenizer (built once per session by tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def nano_tokenizer(nano_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(nano_model_dir)
