"""BinaryCriteoUtils: TSV to .npy, contiguous ids, row ranges per rank, day shuffle."""

import numpy as np

from rectrain.datasets.criteo_npy import BinaryCriteoUtils


def test_tsv_to_npys_logs_shifted_ints_and_parses_hex(tmp_path):
    tsv = tmp_path / "day_0"
    tsv.write_text("\t".join(["1", "-2", "", *["3"] * 11, "ff", "", *["10"] * 24]) + "\n")
    out = [str(tmp_path / name) for name in ("d.npy", "s.npy", "l.npy")]
    BinaryCriteoUtils.tsv_to_npys(str(tsv), *out)
    dense, sparse, labels = (np.load(p) for p in out)
    # the file's smallest int (-2) becomes 2: log(2), log(0 + 4), log(3 + 4)
    np.testing.assert_allclose(dense[0, :3], np.log([2, 4, 7]).astype(np.float32))
    assert sparse.dtype == np.int64 and sparse[0, :3].tolist() == [255, 0, 16]
    assert labels.tolist() == [[1]] and labels.dtype == np.int32


def test_kaggle_test_files_have_no_label_column(tmp_path):
    tsv = tmp_path / "test.txt"
    tsv.write_text("\t".join(["4", *["3"] * 12, *["a"] * 26]) + "\n")
    out = [str(tmp_path / name) for name in ("d.npy", "s.npy", "l.npy")]
    BinaryCriteoUtils.tsv_to_npys(str(tsv), *out, dataset_name="criteo_kaggle")
    assert np.load(out[2]).tolist() == [[-1]] and np.load(out[1])[0, 0] == 10


def test_contiguous_ids_follow_first_appearance_and_drop_rare_values(tmp_path):
    days = [np.array([[50], [70], [50]]), np.array([[90], [70], [50]])]
    paths = []
    for day, array in enumerate(days):
        paths.append(str(tmp_path / f"day_{day}_sparse.npy"))
        np.save(paths[-1], array)
    BinaryCriteoUtils.sparse_to_contiguous(paths, str(tmp_path), frequency_threshold=2, columns=1)
    assert np.load(tmp_path / "day_0_sparse_contig_freq.npy").ravel().tolist() == [2, 3, 2]
    assert np.load(tmp_path / "day_1_sparse_contig_freq.npy").ravel().tolist() == [1, 3, 2]


def test_row_ranges_deal_contiguous_runs_to_ranks():
    ranges = [BinaryCriteoUtils.get_file_row_ranges_and_remainder([5, 4], rank, 2) for rank in range(2)]
    assert ranges == [({0: (0, 4)}, 1), ({1: (0, 3)}, 1)]
    # rows 2..6: rank 0 gets 2..4 (one more, the remainder), rank 1 gets 5..6 (the next file's first two)
    ranks = [BinaryCriteoUtils.get_file_row_ranges_and_remainder([5, 4], r, 2, 2, 6) for r in range(2)]
    assert ranks == [({0: (2, 4)}, 1), ({1: (0, 1)}, 1)]


def test_shuffle_keeps_every_row_and_copies_the_last_day(tmp_path):
    for day in range(3):
        ids = np.arange(day * 4, day * 4 + 4)
        np.save(tmp_path / f"day_{day}_dense.npy", np.stack([ids] * 2, axis=1).astype(np.float32))
        np.save(tmp_path / f"day_{day}_sparse.npy", np.stack([ids] * 3, axis=1).astype(np.int32))
        np.save(tmp_path / f"day_{day}_labels.npy", ids.reshape(-1, 1).astype(np.int32))
    out = tmp_path / "out"
    out.mkdir()
    BinaryCriteoUtils.shuffle(str(tmp_path), str(tmp_path), str(out), {0: 4, 1: 4}, None, 3, 2, 3)
    labels = np.concatenate([np.load(out / f"day_{d}_labels.npy") for d in range(2)]).ravel()
    assert sorted(labels.tolist()) == list(range(8)) and labels.tolist() != list(range(8))
    for day in range(2):
        rows = np.load(out / f"day_{day}_sparse.npy")
        assert (rows[:, 0] == np.load(out / f"day_{day}_labels.npy").ravel()).all()  # rows stay whole
    assert np.load(out / "day_2_labels.npy").ravel().tolist() == [8, 9, 10, 11]
