"""Resume across CPU backward kernels: a checkpoint written while FBGEMM's backward trained the tables loads
into a model that trains with ours (rectrain.embedding.native_backward), and the other way round.

Both kernels keep weights and optimizer state in the TBE's own buffers, so the restored state is bitwise the
saved one and the run continues where it stopped. The continuation then equals the writer kernel's own
continuation within fp32 tolerance only: the kernels sum a row's repeated ids in different orders. Resuming
twice with the same kernel is bitwise identical.
"""

from __future__ import annotations

import pytest
import torch

from rectrain.checkpoint import load_checkpoint, save_checkpoint
from rectrain.embedding.backward_choice import auto_choice
from tests.checkpoint import common

N, M = 3, 3
RTOL, ATOL = 1e-5, 1e-6


def _train_save(root: str, optimizer: str, kernel: str) -> tuple[dict, dict]:
    """N steps with ``kernel``, save, M more: the state at the save and at the end."""
    model = common.build_model(seed=0, optimizer=optimizer, cpu_backward=kernel)
    dense_optimizer = common.make_optimizer(model)
    common.train(model, dense_optimizer, range(N), 0)
    at_save = common.capture(model, dense_optimizer)
    save_checkpoint(root, model=model, optimizer=dense_optimizer, step=N)
    common.train(model, dense_optimizer, range(N, N + M), 0)
    return at_save, common.capture(model, dense_optimizer)


def _resume(root: str, optimizer: str, kernel: str) -> tuple[dict, dict]:
    """A fresh model with ``kernel``: the state right after loading, and after M steps."""
    model = common.build_model(seed=1, optimizer=optimizer, cpu_backward=kernel)
    dense_optimizer = common.make_optimizer(model)
    load_checkpoint(root, model=model, optimizer=dense_optimizer)
    loaded = common.capture(model, dense_optimizer)
    common.train(model, dense_optimizer, range(N, N + M), 0)
    return loaded, common.capture(model, dense_optimizer)


def _assert_close(a: dict, b: dict) -> None:
    for key, pieces in a["pieces"].items():
        for (_, weight, states), (_, weight2, states2) in zip(pieces, b["pieces"][key]):
            torch.testing.assert_close(weight, weight2, rtol=RTOL, atol=ATOL)
            for name in states:
                torch.testing.assert_close(states[name], states2[name], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adagrad", "sgd"])
@pytest.mark.parametrize(("writer", "reader"), [("fbgemm", "native"), ("native", "fbgemm")])
def test_resume_across_kernels(tmp_path, optimizer: str, writer: str, reader: str) -> None:
    at_save, writer_end = _train_save(str(tmp_path), optimizer, writer)
    loaded, reader_end = _resume(str(tmp_path), optimizer, reader)
    assert common.mismatches(at_save, loaded) == []
    _assert_close(reader_end, writer_end)
    _, again = _resume(str(tmp_path), optimizer, reader)
    assert common.mismatches(reader_end, again) == []


def test_auto_model_resumes_a_forced_kernel_checkpoint(tmp_path) -> None:
    """The kernel ``auto`` picks here reads what the other one wrote."""
    other = "fbgemm" if auto_choice().kernel == "native" else "native"
    at_save, writer_end = _train_save(str(tmp_path), "rowwise_adagrad", other)
    loaded, reader_end = _resume(str(tmp_path), "rowwise_adagrad", "auto")
    assert common.mismatches(at_save, loaded) == []
    _assert_close(reader_end, writer_end)
