"""Every shipped DLRM recipe learns: on Criteo-format rows the project generates, its held-out AUC reaches a
plain-PyTorch reference's (26 ``nn.Embedding`` of dim 16, log1p dense, MLP 256-64-1, Adagrad 0.05) trained
on the same rows in the same test, within a margin that covers the noise of a small sample.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rectrain.datasets.criteo import parse_criteo_line
from rectrain.datasets.criteo_synthetic import SyntheticCriteoSpec, write_synthetic_criteo
from rectrain.metrics.functional import auc
from rectrain.train.config import RunConfig
from rectrain.train.job import TrainJob
from tests.train.test_job import EXAMPLES

TRAIN_ROWS, EVAL_ROWS, EPOCHS = 12_000, 4_000, 2


def split_rows(tmp_path):
    """One generated file (one labelling rule), split into training and held-out files."""
    whole = write_synthetic_criteo(
        tmp_path / "all.tsv", SyntheticCriteoSpec(num_rows=TRAIN_ROWS + EVAL_ROWS, vocab_size=300, seed=3)
    )
    lines = whole.read_text().splitlines(keepends=True)
    (tmp_path / "train.tsv").write_text("".join(lines[:TRAIN_ROWS]))
    (tmp_path / "eval.tsv").write_text("".join(lines[TRAIN_ROWS:]))
    return tmp_path / "train.tsv", tmp_path / "eval.tsv"


def read_rows(path, rows):
    parsed = [parse_criteo_line(line.rstrip("\n"), rows) for line in path.read_text().splitlines()]
    labels = torch.tensor([p[0] for p in parsed], dtype=torch.float32)
    return labels, torch.tensor([p[1] for p in parsed]), torch.tensor([p[2] for p in parsed])


def plain_reference_auc(train, held_out, rows, batch_size=1024, epochs=EPOCHS):
    torch.manual_seed(0)
    tables = nn.ModuleList(nn.Embedding(n, 16, sparse=True) for n in rows)
    mlp = nn.Sequential(
        nn.Linear(13 + 16 * len(rows), 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1)
    )

    def logits(dense, ids):
        return mlp(torch.cat([dense, *(t(ids[:, i]) for i, t in enumerate(tables))], 1)).squeeze(1)

    opt = torch.optim.Adagrad([*tables.parameters(), *mlp.parameters()], lr=0.05)
    labels, dense, ids = train
    for _ in range(epochs):
        for idx in torch.randperm(len(labels)).split(batch_size):
            loss = nn.functional.binary_cross_entropy_with_logits(logits(dense[idx], ids[idx]), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return auc(logits(held_out[1], held_out[2]), held_out[0])


@pytest.mark.slow
def test_dlrm_criteo_recipe_reaches_the_plain_reference(tmp_path):
    train_path, eval_path = split_rows(tmp_path)
    base = RunConfig.load(EXAMPLES / "dlrm_criteo.toml")
    steps = EPOCHS * TRAIN_ROWS // base.train.batch_size
    config = RunConfig.load(
        EXAMPLES / "dlrm_criteo.toml",
        [
            f'data.paths=["{train_path}"]',
            f'data.eval_paths=["{eval_path}"]',
            "data.num_workers=0",
            f"train.steps={steps}",
            "train.eval_every=0",
            f"train.eval_batches={EVAL_ROWS // base.train.batch_size + 1}",
            f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
            f'checkpoint.dir="{tmp_path / "ckpt"}"',
            "checkpoint.every_n_steps=0",
        ],
    )
    recipe_auc = TrainJob(config, progress_bar=False).run().eval_metrics["auc"]
    rows = [t.num_embeddings for t in config.model.tables]
    reference = plain_reference_auc(read_rows(train_path, rows), read_rows(eval_path, rows), rows)
    assert recipe_auc >= reference - 0.01, (recipe_auc, reference)
