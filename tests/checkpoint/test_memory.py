"""Saving and loading stream: neither holds a second copy of a table (files are written from the kernels'
storage and read back into it a bounded chunk at a time, without mapping them)."""

from __future__ import annotations

import torch

from rectrain.checkpoint import load_checkpoint, save_checkpoint
from rectrain.embedding import EmbeddingBagCollection, EmbeddingBagConfig
from rectrain.embedding.config import FusedOptimizerConfig

ROWS, DIM = 1_000_000, 64  # 256 MB of weights
SLACK = 96 * 10**6  # one 32 MB read chunk, the row-wise state, allocator noise


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))


def _reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current resident size
    return _status("VmRSS")


def test_save_and_load_add_no_copy_of_the_table(tmp_path):
    table = EmbeddingBagConfig(name="t", num_embeddings=ROWS, embedding_dim=DIM)
    model = EmbeddingBagCollection([table], fused_optimizer=FusedOptimizerConfig())
    weights = ROWS * DIM * 4
    base = _reset_peak()
    save_checkpoint(tmp_path, model=model, optimizer=model.fused_optimizer, step=1)
    assert _status("VmHWM") - base < SLACK, "saving made a copy of the table"
    expected = model.embedding_bags["t"].weight.clone()
    with torch.no_grad():
        model.embedding_bags["t"].weight.zero_()
    base = _reset_peak()
    load_checkpoint(tmp_path, model=model, optimizer=model.fused_optimizer)
    assert _status("VmHWM") - base < SLACK, "loading made a copy of the table"
    assert torch.equal(model.embedding_bags["t"].weight, expected)
    assert weights > 2 * SLACK  # the table is large enough for a copy to show
