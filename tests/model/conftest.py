"""Fixtures the model tests share: tiny random Marian directories (made once per session) and a Translator."""

from __future__ import annotations

from pathlib import Path

import pytest

from model import Translator
from tests.harness.tiny import DEVICE, make_model_dir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random model with separate source and target vocabularies. Shared: copy it before editing."""
    return make_model_dir(tmp_path_factory.mktemp("tiny-separate"), shared=False, seed=6)


@pytest.fixture(scope="session")
def shared_model_dir(tmp_path_factory) -> Path:
    """A tiny random model whose source and target share one vocabulary. Shared: copy it before editing."""
    return make_model_dir(tmp_path_factory.mktemp("tiny-shared"), shared=True, seed=5)


@pytest.fixture(scope="module")
def translator(model_dir) -> Translator:
    """`model_dir` loaded on the test device, once per test module."""
    return Translator.from_pretrained(model_dir, device=DEVICE)
