"""Criteo TSV: parsing, hashing, malformed rows (skip or strict), gzip, and the rank/worker split."""

import gzip
import logging
import math

import pytest
from torch.utils.data import DataLoader

from rectrain.datasets import CriteoConfig, CriteoDataset, MalformedRowError, build_dataset
from rectrain.datasets.criteo import hash_categorical


def _row(label: str = "1", dense: list[str] | None = None, cats: list[str] | None = None) -> str:
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *dense, *cats])


def _write(path, rows: list[str]) -> str:
    text = "".join(r + "\n" for r in rows)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def _all_rows(dataset) -> list[tuple]:
    out = []
    for b in dataset:
        ids = b.sparse_features.values().reshape(26, -1).t()
        out += [
            (lbl, tuple(d), tuple(i))
            for lbl, d, i in zip(b.labels.tolist(), b.dense_features.tolist(), ids.tolist())
        ]
    return out


def test_one_row_is_transformed_and_hashed_as_documented(tmp_path):
    dense = ["", "-5", "0", "1", "10", *["3"] * 8]
    cats = ["", "ff", "FFFFFFFF", *["0a"] * 23]
    path = _write(tmp_path / "day_0.tsv", [_row("0", dense, cats)])
    batch = next(iter(CriteoDataset(CriteoConfig(paths=[path], num_embeddings=101))))
    assert batch.labels.tolist() == [0.0]
    assert batch.dense_features.shape == (1, 13)
    assert batch.dense_features[0, :5].tolist() == pytest.approx([0, 0, 0, math.log(2), math.log(11)])
    kjt = batch.sparse_features
    assert kjt.keys() == [f"cat_{i}" for i in range(26)]
    assert kjt.lengths().tolist() == [1] * 26
    assert kjt.values()[:4].tolist() == [0, 1 + 255 % 100, 1 + 0xFFFFFFFF % 100, 1 + 10 % 100]
    assert hash_categorical("", 7) == 0


def test_malformed_rows_are_counted_skipped_and_warned(tmp_path, caplog):
    rows = [
        _row(),
        _row(label="2"),  # bad label
        _row(dense=["x", *["1"] * 12]),  # non-integer dense (column 2)
        _row(cats=["zz", *["1"] * 25]),  # non-hex categorical (column 15)
        "1\t2\t3",  # wrong column count
        _row(label="0"),
    ]
    path = _write(tmp_path / "bad.tsv", rows)
    ds = CriteoDataset(CriteoConfig(paths=[path], batch_size=8))
    with caplog.at_level(logging.WARNING):
        batches = list(ds)
    assert [b.labels.tolist() for b in batches] == [[1.0, 0.0]]
    assert ds.stats.rows_read == 2 and ds.stats.rows_skipped == 4
    assert dict(ds.stats.skipped_by_column) == {1: 1, 2: 1, 15: 1, "*": 1}
    assert f"{path}:3: column 2" in caplog.text and f"{path}:5: column *" in caplog.text


def test_strict_raises_naming_file_line_and_column(tmp_path):
    path = _write(tmp_path / "bad.tsv", [_row(), _row(cats=["12", "nothex", *["1"] * 24])])
    with pytest.raises(MalformedRowError, match=r"bad\.tsv:2: column 16: .*cat_1 is not hex") as e:
        list(CriteoDataset(CriteoConfig(paths=[path], strict=True)))
    assert (e.value.line, e.value.column) == (2, 16)
    assert isinstance(e.value, ValueError)


def test_gzip_matches_plain_and_batches_split(tmp_path):
    rows = [_row(str(i % 2), cats=[f"{i * 7 + k:x}" for k in range(26)]) for i in range(10)]
    plain = CriteoConfig(paths=[_write(tmp_path / "a.tsv", rows)], batch_size=4)
    zipped = CriteoConfig(paths=[_write(tmp_path / "a.tsv.gz", rows)], batch_size=4)
    plain_batches = list(CriteoDataset(plain))
    assert [len(b.labels) for b in plain_batches] == [4, 4, 2]
    assert _all_rows(CriteoDataset(plain)) == _all_rows(CriteoDataset(zipped))
    zipped.drop_last = True
    assert [len(b.labels) for b in CriteoDataset(zipped)] == [4, 4]


def test_ranks_take_blocks_of_global_windows_whatever_the_workers(tmp_path):
    rows = [_row(str(i % 2), cats=[f"{i:x}"] * 26) for i in range(23)]
    cfg = CriteoConfig(paths=[_write(tmp_path / "a.tsv", rows)], batch_size=3, num_embeddings=1000)
    everything = sorted(_all_rows(CriteoDataset(cfg)))
    shares = []
    for rank in range(2):
        loader = DataLoader(build_dataset(cfg, rank, 2), batch_size=None, num_workers=2)
        shares.append(_all_rows(loader))
        assert shares[-1] == _all_rows(build_dataset(cfg, rank, 2)), "workers change nothing"
    assert sorted(shares[0] + shares[1]) == everything
    # Windows of 2 x 3 lines: rank 0 takes the first 3 of each, rank 1 the rest; the last window
    # (lines 18..22) is split 2 + 3.
    first_ids = [r[2][0] for r in shares[0]]
    assert first_ids == [1 + i for i in (0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19)]
    positions = [w.end for w in CriteoDataset(cfg, 1, 2).windows()]
    assert positions == [6, 12, 18, 23]
    resumed = CriteoDataset(cfg, 0, 1, start_row=12)
    assert [r[2][0] for r in _all_rows(resumed)] == [1 + i for i in range(12, 23)]


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="num_embeddings"):
        CriteoConfig(paths=["x.tsv"], num_embeddings=1)
    with pytest.raises(ValueError, match="paths"):
        CriteoConfig(paths="x.tsv")
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        list(CriteoDataset(CriteoConfig(paths=[str(tmp_path / "missing.tsv")])))
    with pytest.raises(ValueError, match="rank"):
        CriteoDataset(CriteoConfig(paths=["x.tsv"]), rank=2, world_size=2)
