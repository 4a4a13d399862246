"""MovieLens ratings.dat / ratings.csv: ids, labels, header, bad rows, sharding."""

import gzip

import pytest
import torch

from rectrain.datasets import MalformedRowError, MovieLensConfig, MovieLensDataset, build_dataset


def _dat(tmp_path, lines: list[str], name: str = "ratings.dat") -> str:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_ml1m_dat_binary_labels_and_ids(tmp_path):
    path = _dat(tmp_path, ["1::1193::5::978300760", "1::661::3::978302109", "6040::3952::4::956704887"])
    cfg = MovieLensConfig(paths=[path], num_user_embeddings=6041, num_movie_embeddings=1000)
    (batch,) = list(MovieLensDataset(cfg))
    kjt = batch.sparse_features
    assert kjt.keys() == ["user_id", "movie_id"]
    assert kjt["user_id"].values().tolist() == [1, 1, 6040]
    assert kjt["movie_id"].values().tolist() == [193, 661, 952]  # raw id % 1000
    assert batch.labels.tolist() == [1.0, 0.0, 1.0]  # rating >= 4
    assert batch.dense_features.shape == (3, 0)


def test_csv_with_header_regression_and_gzip(tmp_path):
    path = tmp_path / "ratings.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("userId,movieId,rating,timestamp\n1,296,5.0,1147880044\n2,306,3.5,1147868817\n")
    cfg = MovieLensConfig(paths=[str(path)], task="regression", batch_size=1)
    batches = list(build_dataset(cfg))
    assert [b.labels.tolist() for b in batches] == [[5.0], [3.5]]
    assert [b.sparse_features["movie_id"].values().tolist() for b in batches] == [[296], [306]]


def test_bad_rows_skipped_or_strict(tmp_path):
    lines = ["1::10::4::1", "1::x::4::1", "1::10::good::1", "1::10::4", "-3::10::4::1", "2::20::1::5"]
    path = _dat(tmp_path, lines)
    ds = MovieLensDataset(MovieLensConfig(paths=[path]))
    (batch,) = list(ds)
    assert batch.labels.tolist() == [1.0, 0.0]
    assert ds.stats.rows_skipped == 4
    assert dict(ds.stats.skipped_by_column) == {2: 1, 3: 1, "*": 1, 1: 1}
    with pytest.raises(MalformedRowError, match=r"ratings\.dat:2: column 2: movie_id is not an integer"):
        list(MovieLensDataset(MovieLensConfig(paths=[path], strict=True)))


def test_ranks_split_the_lines(tmp_path):
    path = _dat(tmp_path, [f"{u}::{u + 100}::5::0" for u in range(7)])
    cfg = MovieLensConfig(paths=[path], batch_size=2)
    users = [
        torch.cat([b.sparse_features["user_id"].values() for b in MovieLensDataset(cfg, r, 2)]).tolist()
        for r in range(2)
    ]
    assert users == [[0, 1, 4], [2, 3, 5, 6]]  # windows of 2 x 2 lines; the last (3 lines) split 1 + 2


def test_config_errors():
    with pytest.raises(ValueError, match="task"):
        MovieLensConfig(paths=["ratings.dat"], task="ranking")
    with pytest.raises(ValueError, match=r"ratings\.json"):
        MovieLensConfig(paths=["ratings.json"])
