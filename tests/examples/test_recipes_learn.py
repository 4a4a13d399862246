"""Every shipped Criteo recipe (DLRM, DCN) learns: on Criteo-format rows the project generates, its held-out
AUC after two epochs on 1 and 2 ranks reaches a plain-PyTorch reference's (26 ``nn.Embedding`` of dim 16,
log1p dense, MLP 256-64-1, Adagrad 0.05) trained on the same rows in the same test, less 0.01. At ten times
its learning rates a recipe still learns, or the divergence guard stops it with a one-line message, or (a
model at chance from its first evaluation, which the guard cannot tell from labels without signal) every
evaluation says in one line that the model is not learning and to lower the learning rates.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rectrain.datasets.criteo import parse_criteo_line
from rectrain.datasets.criteo_synthetic import SyntheticCriteoSpec, write_synthetic_criteo
from rectrain.metrics.functional import auc
from rectrain.train.config import RunConfig
from rectrain.train.guard import TrainingDiverged
from rectrain.train.job import TrainJob
from tests.distributed.multiprocess import run_multiprocess
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


def recipe_config(recipe, train_path, eval_path, tmp_path, world_size=1, *extra):
    """``recipe`` for two epochs of the training file (split across ``world_size`` ranks), evaluated once."""
    base = RunConfig.load(EXAMPLES / recipe)
    steps = EPOCHS * TRAIN_ROWS // (base.train.batch_size * world_size)
    return RunConfig.load(
        EXAMPLES / recipe,
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
            *extra,
        ],
    )


def _train_rank(env, config):
    return TrainJob(config, env, progress_bar=False).run().eval_metrics["auc"]


def reference_for(config, train_path, eval_path):
    rows = [t.num_embeddings for t in config.model.tables]
    return plain_reference_auc(read_rows(train_path, rows), read_rows(eval_path, rows), rows)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("recipe", ["dlrm_criteo.toml", "dcn_criteo.toml"])
def test_criteo_recipe_reaches_the_plain_reference(tmp_path, recipe, world_size):
    train_path, eval_path = split_rows(tmp_path)
    config = recipe_config(recipe, train_path, eval_path, tmp_path, world_size)
    if world_size == 1:
        recipe_auc = _train_rank(None, config)
    else:
        aucs = run_multiprocess(_train_rank, world_size, config, timeout=400.0)
        assert len(set(aucs)) == 1  # the held-out AUC is computed over every rank's examples
        recipe_auc = aucs[0]
    reference = reference_for(config, train_path, eval_path)
    assert recipe_auc >= reference - 0.01, (recipe_auc, reference)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["dlrm_criteo.toml", "dcn_criteo.toml"])
def test_ten_times_the_learning_rates_learns_or_stops_with_one_line(tmp_path, recipe, caplog):
    train_path, eval_path = split_rows(tmp_path)
    base = RunConfig.load(EXAMPLES / recipe).optimizer
    hot = [f"optimizer.sparse_lr={10 * base.sparse_lr}", f"optimizer.dense_lr={10 * base.dense_lr}"]
    config = recipe_config(recipe, train_path, eval_path, tmp_path, 1, "train.eval_every=6", *hot)
    try:
        recipe_auc = _train_rank(None, config)
    except TrainingDiverged as stopped:
        message = str(stopped)
        assert message.startswith("training diverged at step ") and "\n" not in message
        assert "Fix: lower optimizer.sparse_lr" in message
        return
    never_learning = [r.getMessage() for r in caplog.records if "the model is not learning" in r.getMessage()]
    if abs(recipe_auc - 0.5) < 0.01 and never_learning:
        assert all("lower optimizer.sparse_lr" in m and "\n" not in m for m in never_learning)
        assert len(never_learning) >= 2  # said again at each evaluation, not once and lost in the log
        return
    assert recipe_auc >= reference_for(config, train_path, eval_path) - 0.02, recipe_auc
