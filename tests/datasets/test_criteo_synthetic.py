"""The synthetic Criteo writer: files the real reader accepts (plain, gzip), deterministic, learnable."""

from dataclasses import replace

import pytest
import torch

from rectrain.datasets import CriteoConfig, CriteoDataset
from rectrain.datasets.criteo_synthetic import (
    SyntheticCriteoSpec,
    synthetic_criteo_token,
    write_synthetic_criteo,
)
from rectrain.errors import ConfigError
from rectrain.metrics import auc


def _read(path, rows: int = 4096) -> list:
    config = CriteoConfig(paths=[str(path)], batch_size=512, num_embeddings=rows, strict=True)
    return list(CriteoDataset(config))


@pytest.mark.parametrize("name", ["data.tsv", "data.tsv.gz"])
def test_the_criteo_reader_reads_every_row_strictly(tmp_path, name):
    path = write_synthetic_criteo(tmp_path / name, SyntheticCriteoSpec(num_rows=1000, seed=1))
    batches = _read(path)
    assert sum(b.labels.numel() for b in batches) == 1000
    labels = torch.cat([b.labels for b in batches]).float()
    assert 0.2 < labels.mean().item() < 0.8
    assert not (tmp_path / f".{name}.tmp").exists()


def test_same_seed_same_bytes(tmp_path):
    spec = SyntheticCriteoSpec(num_rows=200, seed=7)
    a = write_synthetic_criteo(tmp_path / "a.tsv", spec).read_bytes()
    b = write_synthetic_criteo(tmp_path / "b.tsv", spec).read_bytes()
    assert a == b
    other = SyntheticCriteoSpec(num_rows=200, seed=8)
    assert a != write_synthetic_criteo(tmp_path / "c.tsv", other).read_bytes()


def test_labels_are_learnable_from_the_categorical_ids(tmp_path):
    path = write_synthetic_criteo(tmp_path / "d.tsv", SyntheticCriteoSpec(num_rows=12_000, vocab_size=200))
    batches = _read(path, rows=4096)
    train, held_out = batches[:-4], batches[-4:]
    torch.manual_seed(0)
    weights = torch.nn.EmbeddingBag(4096 * 26, 1, mode="sum")
    torch.nn.init.zeros_(weights.weight)
    opt = torch.optim.Adagrad(weights.parameters(), lr=0.1)

    def logits(b):
        ids = b.sparse_features.values().view(26, -1).t() + torch.arange(26) * 4096
        return weights(ids).squeeze(-1)

    for _ in range(3):
        for b in train:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(b), b.labels.float())
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        scores = torch.cat([logits(b) for b in held_out])
    assert auc(scores, torch.cat([b.labels for b in held_out])) > 0.65


def test_bad_spec_names_the_field():
    with pytest.raises(ConfigError, match="num_rows"):
        SyntheticCriteoSpec(num_rows=0)
    with pytest.raises(ConfigError, match="missing_rate"):
        SyntheticCriteoSpec(missing_rate=1.5)


def _columns(path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()]


def test_parts_share_the_hidden_task_and_differ_in_rows(tmp_path):
    spec = SyntheticCriteoSpec(num_rows=2000, vocab_size=50, seed=3)
    one = _columns(write_synthetic_criteo(tmp_path / "1.tsv", replace(spec, part=1)))
    two = _columns(write_synthetic_criteo(tmp_path / "2.tsv", replace(spec, part=2)))
    assert one != two
    for column in (0, 25):  # the same 50 tokens per column, the most frequent one first
        tokens = {row[14 + column] for row in one} | {row[14 + column] for row in two}
        assert len(tokens - {""}) <= 50
        assert synthetic_criteo_token(spec, column, 0) in tokens
    assert synthetic_criteo_token(spec, 0, 0) == synthetic_criteo_token(replace(spec, part=7), 0, 0)


def test_planted_tokens_click_far_more_on_the_same_rows(tmp_path):
    spec = SyntheticCriteoSpec(num_rows=4000, vocab_size=50, seed=1, part=2)
    plain = _columns(write_synthetic_criteo(tmp_path / "plain.tsv", spec))
    planted_spec = replace(spec, planted=((0, 1), (1, 1)), planted_boost=5.0)
    planted = _columns(write_synthetic_criteo(tmp_path / "planted.tsv", planted_spec))
    assert [row[1:] for row in plain] == [row[1:] for row in planted]  # only labels change
    hot = {(0, synthetic_criteo_token(spec, 0, 1)), (1, synthetic_criteo_token(spec, 1, 1))}
    rows = [i for i, row in enumerate(plain) if any(row[14 + c] == token for c, token in hot)]
    others = [i for i in range(len(plain)) if i not in set(rows)]
    assert len(rows) > 200

    def clicks(table, which):
        return sum(int(table[i][0]) for i in which) / len(which)

    assert clicks(planted, rows) > 0.9 and clicks(plain, rows) < 0.75
    assert clicks(planted, others) == clicks(plain, others)


def test_bad_planted_or_part_names_the_field():
    with pytest.raises(ConfigError, match=r"planted: \(26, 0\)"):
        SyntheticCriteoSpec(planted=((26, 0),))
    with pytest.raises(ConfigError, match="planted"):
        SyntheticCriteoSpec(vocab_size=10, planted=((0, 10),))
    with pytest.raises(ConfigError, match="part"):
        SyntheticCriteoSpec(part=-1)
