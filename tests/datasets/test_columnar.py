"""Converted data: the TSV readers' batches, a manifest that catches damage, global row ranges that resume
on any world size, a seeded shuffle, DataLoader workers, and users' Parquet with named columns."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from rectrain.datasets import CriteoConfig, CriteoDataset, MovieLensConfig, MovieLensDataset
from rectrain.datasets.columnar import ColumnarConfig, ColumnarDataset, ColumnarManifest, DataFormatError
from rectrain.datasets.columnar.plan import RowOrder, epoch_rows, rank_windows_of
from rectrain.datasets.convert import convert
from rectrain.datasets.windows import Holdout, rank_windows
from rectrain.errors import ConfigError
from tests.datasets.test_criteo_columns import _rows, assert_same_batches


def _criteo_file(tmp_path, n: int = 200, bad: bool = True) -> str:
    rows = _rows(n, seed=3)
    if bad:
        rows[5] = "1\t2\t3"
    path = tmp_path / "day.tsv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _converted(
    tmp_path, n: int = 200, rows_per_part: int = 37, bad: bool = True, **criteo
) -> tuple[str, CriteoConfig]:
    config = CriteoConfig(paths=[_criteo_file(tmp_path, n, bad)], num_embeddings=997, **criteo)
    out = tmp_path / "conv"
    convert(config, out, rows_per_part=rows_per_part)
    return str(out), config


def _ids_of(batches) -> list[int]:
    """The first feature's id of every example, in order (rows are told apart by them)."""
    return [i for b in batches for i in b.sparse_features.values().reshape(26, -1)[0].tolist()]


def test_converted_criteo_gives_the_tsv_readers_batches(tmp_path):
    out, config = _converted(tmp_path)
    manifest, _ = ColumnarManifest.load(out)
    assert manifest.num_rows == 199 and [p.rows for p in manifest.parts] == [37] * 5 + [14]
    assert manifest.source["rows_skipped"] == 1 and manifest.table_rows == [997] * 26
    assert manifest.id_dtype == "int32"
    # The same rows in the same order; the malformed line is a row of the TSV's windows only.
    converted = ColumnarDataset(ColumnarConfig(paths=[out], batch_size=16, table_rows=[997] * 26))
    assert _ids_of(converted) == _ids_of(CriteoDataset(config))
    clean_dir = tmp_path / "clean"
    clean_dir.mkdir()
    clean_out, clean = _converted(clean_dir, bad=False)
    for batch_size, world_size, start_row, select in [
        (1, 1, 0, None),
        (16, 1, 0, Holdout(3, 16)),
        (16, 2, 40, None),
        (64, 3, 0, Holdout(4, 64, held_out=True)),
    ]:
        clean.batch_size = batch_size
        columnar = ColumnarConfig(paths=[clean_out], batch_size=batch_size, table_rows=[997] * 26)
        for rank in range(world_size):
            kwargs = {"start_row": start_row, "select": select}
            got = list(ColumnarDataset(columnar, rank, world_size, **kwargs).windows())
            want = list(CriteoDataset(clean, rank, world_size, **kwargs).windows())
            assert [w.end for w in got] == [w.end for w in want]  # the same data positions
            assert_same_batches([w.batch for w in got], [w.batch for w in want])


def test_converted_movielens_gives_the_ratings_readers_batches(tmp_path):
    ratings = tmp_path / "ratings.dat"
    ratings.write_text(
        "".join(f"{u}::{u * 7 % 50}::{u % 5 + 1}::97830{u}\n" for u in range(1, 90)) + "x::1::2::3\n"
    )
    config = MovieLensConfig(
        paths=[str(ratings)], num_user_embeddings=40, num_movie_embeddings=30, batch_size=16
    )
    convert(config, tmp_path / "ml")
    converted = ColumnarDataset(
        ColumnarConfig(paths=[str(tmp_path / "ml")], batch_size=16, label_threshold=4.0)
    )
    assert converted.feature_names == ["user_id", "movie_id"]
    assert_same_batches(list(converted), list(MovieLensDataset(config)))


def test_the_manifest_catches_damage_and_mismatches(tmp_path, capsys):
    out, _ = _converted(tmp_path)
    from rectrain.cli import main

    assert main(["data", "verify", out]) == 0
    assert "199 criteo rows in 6 part(s); sizes and sha256 match" in capsys.readouterr().out
    part = tmp_path / "conv" / "part-00001.safetensors"
    data = bytearray(part.read_bytes())
    data[-1] ^= 1
    part.write_bytes(bytes(data))
    assert main(["data", "verify", out]) == 2
    assert "part-00001.safetensors: sha256 does not match" in capsys.readouterr().err
    part.write_bytes(bytes(data[:-4]))
    with pytest.raises(DataFormatError, match="part-00001.safetensors: .* bytes, the manifest records"):
        ColumnarDataset(ColumnarConfig(paths=[out]))
    data[-1] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="cat_0: 997 \\(table has 1000\\)"):
        ColumnarDataset(ColumnarConfig(paths=[out], table_rows=[1000] * 26))
    manifest = tmp_path / "conv" / "manifest.json"
    raw = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**raw, "format_version": 2}))
    with pytest.raises(DataFormatError, match="format_version 2; this rectrain reads 1"):
        ColumnarDataset(ColumnarConfig(paths=[out]))
    manifest.unlink()
    with pytest.raises(DataFormatError, match="no manifest .*rectrain data convert"):
        ColumnarDataset(ColumnarConfig(paths=[out]))


def test_convert_refuses_a_used_directory_unless_overwriting(tmp_path):
    out, config = _converted(tmp_path)
    with pytest.raises(DataFormatError, match="not empty"):
        convert(config, out)
    (tmp_path / "conv" / "notes.txt").write_text("mine")
    convert(config, out, overwrite=True, rows_per_part=1000)
    names = sorted(p.name for p in (tmp_path / "conv").iterdir())
    assert names == ["manifest.json", "notes.txt", "part-00000.safetensors"]


@given(
    num_rows=st.integers(0, 120),
    batch_size=st.integers(1, 9),
    world_size=st.integers(1, 4),
    start=st.integers(0, 130),
    holdout=st.one_of(st.none(), st.tuples(st.integers(2, 4), st.integers(1, 9), st.booleans())),
    drop_last=st.booleans(),
    shuffle_block=st.one_of(st.none(), st.integers(1, 40)),
)
def test_columnar_windows_are_the_windows_of_the_rows_in_order(
    num_rows, batch_size, world_size, start, holdout, drop_last, shuffle_block
):
    """``plan`` computes what ``windows.rank_windows`` cuts from the epoch's rows, numbered by position."""
    start = min(start, num_rows)
    select = None if holdout is None else Holdout(*holdout)
    order = RowOrder(num_rows) if shuffle_block is None else RowOrder.shuffled(num_rows, 5, 1, shuffle_block)
    epoch = epoch_rows(order, select, start)
    in_order = [r for a, b in epoch_rows(order).row_ranges(0, num_rows) for r in range(a, b)]
    if shuffle_block is not None:
        assert sorted(in_order) == list(range(num_rows))
    kept = [(p, r) for p, r in enumerate(in_order) if p >= start and (select is None or select.keeps(r))]
    for rank in range(world_size):
        want = [
            ([r for _, r in w.rows], w.end)
            for w in rank_windows(kept, batch_size, rank, world_size, drop_last=drop_last)
        ]
        got = [
            ([r for a, b in epoch.row_ranges(lo, hi) for r in range(a, b)], end)
            for lo, hi, end in rank_windows_of(epoch, batch_size, rank, world_size, drop_last)
        ]
        assert got == want


def test_shuffled_order_is_a_seeded_permutation_per_epoch():
    def rows(seed: int, epoch: int) -> list[int]:
        order = RowOrder.shuffled(1000, seed, epoch, block_rows=64)
        return [r for a, b in epoch_rows(order).row_ranges(0, 1000) for r in range(a, b)]

    first = rows(7, 0)
    assert sorted(first) == list(range(1000)) and first != list(range(1000))
    assert rows(7, 0) == first and rows(7, 1) != first and rows(8, 0) != first


def test_ranks_workers_shuffle_and_start_partition_the_rows(tmp_path):
    out, _ = _converted(tmp_path, n=301, rows_per_part=50)
    config = ColumnarConfig(paths=[out], batch_size=8, shuffle=True, seed=3, shuffle_block_rows=16)
    alone = _ids_of(ColumnarDataset(config))
    per_rank = [ColumnarDataset(config, rank, 3) for rank in range(3)]
    for dataset in per_rank:
        loaded = list(DataLoader(dataset, batch_size=None, num_workers=2))
        assert_same_batches(loaded, list(dataset))
    assert sorted(sum((_ids_of(d) for d in per_rank), [])) == sorted(alone)
    resumed = ColumnarDataset(config, 0, 2, start_row=8 * 3 * 4)  # 4 steps of 3 ranks x 8 done
    assert _ids_of(resumed)[:8] == alone[8 * 12 : 8 * 13]
    next_epoch = ColumnarDataset(config, 0, 2, start_row=8 * 3 * 4, epoch=1)
    assert _ids_of(next_epoch)[:8] != alone[8 * 12 : 8 * 13]
    with pytest.raises(ConfigError, match="outside the epoch's 300 rows"):
        ColumnarDataset(config, start_row=301)


def _write_parquet(path, n: int, row_group_size: int = 7) -> None:
    rng = random.Random(0)
    table = pa.table(
        {
            "clicked": pa.array([rng.random() < 0.5 for _ in range(n)]),
            "age": pa.array([None if i % 5 == 0 else float(i) for i in range(n)], pa.float64()),
            "count": pa.array(list(range(n)), pa.int32()),
            "user": pa.array([i * 1000 + 3 for i in range(n)], pa.int64()),
            "items": pa.array(
                [None if i % 4 == 0 else list(range(i % 3)) for i in range(n)], pa.list_(pa.int64())
            ),
            "shop": pa.array([None if i % 3 == 0 else -i for i in range(n)], pa.int64()),
        }
    )
    pq.write_table(table, path, row_group_size=row_group_size)


def test_users_parquet_with_named_columns(tmp_path):
    path = tmp_path / "data.parquet"
    _write_parquet(path, 30)
    config = ColumnarConfig(
        paths=[str(path)],
        format="parquet",
        batch_size=8,
        label_column="clicked",
        dense_columns=["age", "count"],
        sparse_columns=["user", "items", "shop"],
        table_rows=[100, 10, 7],
    )
    batches = list(ColumnarDataset(config))
    assert [len(b.labels) for b in batches] == [8, 8, 8, 6]
    first = batches[0]
    assert first.dense_features[:2].tolist() == [[0.0, 0.0], [1.0, 1.0]]  # null age -> 0
    kjt = first.sparse_features
    assert kjt.keys() == ["user", "items", "shop"]
    assert kjt["user"].values().tolist() == [(i * 1000 + 3) % 100 for i in range(8)]
    assert kjt["items"].lengths().tolist() == [0 if i % 4 == 0 else i % 3 for i in range(8)]
    assert kjt["shop"].lengths().tolist() == [0 if i % 3 == 0 else 1 for i in range(8)]
    assert kjt["shop"].values().tolist() == [-i % 7 for i in range(8) if i % 3]
    table = pq.read_table(path)
    assert torch.cat([b.labels for b in batches]).tolist() == [
        float(x) for x in table.column("clicked").to_pylist()
    ]
    two_ranks = [ColumnarDataset(config, r, 2) for r in range(2)]
    assert sorted(v for d in two_ranks for b in d for v in b.dense_features[:, 1].tolist()) == list(
        map(float, range(30))
    )


def test_parquet_errors_name_the_file_and_column(tmp_path):
    path = tmp_path / "data.parquet"
    _write_parquet(path, 10)
    base = {"paths": [str(path)], "format": "parquet", "label_column": "clicked", "table_rows": [10]}
    with pytest.raises(ConfigError, match="no column 'nope' \\(sparse\\)"):
        ColumnarDataset(ColumnarConfig(**base, sparse_columns=["nope"]))
    with pytest.raises(ConfigError, match="dense column 'items' has type list"):
        ColumnarDataset(ColumnarConfig(**base, sparse_columns=["user"], dense_columns=["items"]))
    with pytest.raises(ConfigError, match="sparse column 'age' has type double"):
        ColumnarDataset(ColumnarConfig(**base, sparse_columns=["age"]))
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"y": pa.array([1.0, None]), "u": pa.array([1, 2])}), nulls)
    dataset = ColumnarDataset(
        ColumnarConfig(
            paths=[str(nulls)], format="parquet", label_column="y", sparse_columns=["u"], table_rows=[5]
        )
    )
    with pytest.raises(DataFormatError, match="nulls.parquet: row 1: label column 'y' is null"):
        list(dataset)
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("hello")
    with pytest.raises(DataFormatError, match="x.parquet: not a readable Parquet file"):
        ColumnarDataset(ColumnarConfig(**{**base, "paths": [str(not_parquet)]}, sparse_columns=["user"]))
