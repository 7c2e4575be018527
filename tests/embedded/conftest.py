"""Fixtures of the serving-path and fault tests (test_serving_paths.py, test_faults.py):
the real SmolLM2 weights and their tokenizer, loaded once a module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def path_weights():
    torch = pytest.importorskip("torch")
    from niah.serving.embedded import weights

    torch.set_num_threads(2)
    return weights.load()


@pytest.fixture(scope="module")
def path_tok(path_weights):
    return path_weights.tokenizer
