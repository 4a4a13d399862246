"""The catalogue reader: columns parsed vectorised equal the cell-by-cell parse; a bad cell is named."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recserve.errors import ExportError
from recserve.recommend import catalogue as catalogue_module
from recserve.recommend.catalogue import Catalogue, ItemBatch


def _joined(batches: list[ItemBatch]) -> tuple:
    sparse = {
        f: tuple(torch.cat([b.sparse[f][i] for b in batches]) for i in (0, 1)) for f in batches[0].sparse
    }
    return torch.cat([b.item_ids for b in batches]), sparse, torch.cat([b.dense for b in batches])


def _cell_by_cell(path, rows: int, monkeypatch) -> list[ItemBatch]:
    with monkeypatch.context() as m:
        m.setattr(catalogue_module, "_fast_batch", lambda *_: None)
        return list(Catalogue(path).batches(rows))


def _assert_same(a: list[ItemBatch], b: list[ItemBatch]) -> None:
    (ids_a, sparse_a, dense_a), (ids_b, sparse_b, dense_b) = _joined(a), _joined(b)
    assert torch.equal(ids_a, ids_b) and torch.equal(dense_a, dense_b)
    assert sparse_a.keys() == sparse_b.keys()
    for f in sparse_a:
        assert all(torch.equal(x, y) for x, y in zip(sparse_a[f], sparse_b[f])), f


def test_tsv_columns_parse_as_cell_by_cell(tmp_path, monkeypatch):
    path = tmp_path / "items.tsv"
    # Columns in any order, empty bags, spaces around ids, exponents: what int() / float() accept.
    path.write_text(
        "item_id\tdense:pop\titem\tgenre\n"
        "5\t0.5\t1\t\n6\t1e-3\t2\t3,4\n7\t 2 \t3\t 5 , 6\n8\t-1\t4\t9\n9\t0\t1_0\t7\n"
    )
    fast = list(Catalogue(path).batches(2))
    assert [len(b) for b in fast] == [2, 2, 1] and [b.first for b in fast] == [0, 2, 4]
    _assert_same(fast, _cell_by_cell(path, 2, monkeypatch))
    ids, sparse, dense = _joined(fast)
    assert ids.tolist() == [5, 6, 7, 8, 9] and dense[:, 0].tolist() == pytest.approx([0.5, 1e-3, 2, -1, 0])
    assert sparse["genre"][0].tolist() == [0, 2, 2, 1, 1] and sparse["genre"][1].tolist() == [
        3,
        4,
        5,
        6,
        9,
        7,
    ]
    assert sparse["item"][1].tolist() == [1, 2, 3, 4, 10]


def test_parquet_columns_parse_as_cell_by_cell(tmp_path, monkeypatch):
    table = pa.table(
        {
            "item_id": pa.array([1, 2, 3], pa.int64()),
            "item": pa.array([[1, 2], None, []], pa.list_(pa.int32())),
            "genre": pa.array([4, None, 5], pa.int64()),
            "dense:x": pa.array([0.5, 1.0, 2.0], pa.float32()),
        }
    )
    pq.write_table(table, tmp_path / "items.parquet")
    fast = list(Catalogue(tmp_path / "items.parquet").batches(2))
    _assert_same(fast, _cell_by_cell(tmp_path / "items.parquet", 2, monkeypatch))
    _, sparse, _ = _joined(fast)
    assert sparse["item"][0].tolist() == [2, 0, 0] and sparse["genre"][0].tolist() == [1, 0, 1]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("2\tx\t0.5", "bad.tsv:4: item: expected a non-negative int64, got 'x'"),
        ("2\t3\t4\t5", "bad.tsv:4: 4 columns, the header has 3"),
        ("-2\t3\t0.5", "bad.tsv:4: item_id: expected a non-negative int64, got '-2'"),
        ("2\t3\tnan", "bad.tsv:4: dense:x: expected a finite float, got nan"),
        ("2\t3,,4\t1", "bad.tsv:4: item: expected a non-negative int64, got ''"),
        ("2\t3\t", "bad.tsv:4: dense:x: expected a float, got ''"),
        ("99999999999999999999\t3\t1", "bad.tsv:4: item_id: expected a non-negative int64"),
    ],
)
def test_a_bad_cell_is_named_by_line_and_column(tmp_path, rows, message):
    # The bad line comes after a whole good batch: its number counts the lines before it.
    path = tmp_path / "bad.tsv"
    path.write_text(f"item_id\titem\tdense:x\n0\t1\t0.1\n1\t2\t0.2\n{rows}\n")
    with pytest.raises(ExportError) as error:
        list(Catalogue(path).batches(2))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_null_id_in_a_parquet_list_is_named_by_row(tmp_path):
    table = pa.table({"item_id": [1, 2], "item": pa.array([[1], [None]], pa.list_(pa.int64()))})
    pq.write_table(table, tmp_path / "items.parquet")
    with pytest.raises(ExportError, match=r"items.parquet: row 1: item: expected a non-negative int64"):
        list(Catalogue(tmp_path / "items.parquet").batches(8))
