"""Export tests compare packages with fp32 references (the dequantized model, TorchRec's own scores) bit for
bit, so their packages run the dense part as exported: on a CPU with native bf16, ``Predictor.load`` would
otherwise run it in bf16 (issue 37; tests/runtime/test_dense_precision.py tests that default)."""

from __future__ import annotations

import pytest

from recserve.runtime.dense_precision import ENV


@pytest.fixture(autouse=True)
def dense_as_exported(monkeypatch):
    monkeypatch.setenv(ENV, "fp32")
