"""TorchRec's IterDataPipe helpers at rectrain.datasets.utils: splits, limit, CSV lines, parallel reads."""

from unittest.mock import Mock, patch

import pytest
from torch.utils.data import IterDataPipe

from rectrain.datasets.utils import (
    LoadFiles,
    ParallelReadConcat,
    ReadLinesFromCSV,
    idx_split_train_val,
    rand_split_train_val,
    safe_cast,
)


class Numbers(IterDataPipe):
    def __init__(self, count: int, tag: str = "") -> None:
        self.count, self.tag = count, tag

    def __iter__(self):
        return ((i, self.tag) for i in range(self.count))


def test_index_split_takes_the_first_train_perc_of_every_hundred():
    train, val = idx_split_train_val(Numbers(300), 0.25)
    assert [i for i, _ in train][:26] == [*range(25), 100]
    assert len(list(val)) == 225


def test_random_split_is_disjoint_and_repeatable():
    train, val = rand_split_train_val(Numbers(1000), 0.7, random_seed=3)
    first = list(train)
    assert first == list(train) and not set(first) & set(val)
    assert len(first) + len(list(val)) == 1000
    with pytest.raises(ValueError, match="train_perc"):
        rand_split_train_val(Numbers(3), 1.0)


def test_limit_and_safe_cast():
    assert len(list(Numbers(100).limit(7))) == 7
    assert safe_cast("x", int, -1) == -1 and safe_cast("4", int, -1) == 4


def test_workers_read_contiguous_shares_earlier_ones_larger():
    pipes = [Numbers(1, str(i)) for i in range(5)]
    shares = []
    for worker in range(2):
        with patch("rectrain.datasets.utils.get_worker_info", return_value=Mock(id=worker, num_workers=2)):
            shares.append([tag for _, tag in ParallelReadConcat(*pipes)])
    assert shares == [["0", "1", "2"], ["3", "4"]]


def test_csv_lines_of_loaded_files(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("h1,h2\n1,2\n3,4\n")
    rows = list(ReadLinesFromCSV(LoadFiles([str(path)], mode="r"), skip_first_line=True))
    assert rows == [["1", "2"], ["3", "4"]]
