"""TorchRec's raw-row Criteo TSV stream: default row mapping, workers reading each file once."""

import pytest
from torch.utils.data import DataLoader

from rectrain.datasets.criteo_tsv import _default_row_mapper, criteo_kaggle, criteo_terabyte


def test_default_mapper_names_columns_from_the_end():
    row = ["1", "5", "", *["7"] * 11, "0a1b", "", *["ff"] * 24]
    mapped = _default_row_mapper(row)
    assert mapped["label"] == 1 and mapped["int_0"] == 5 and mapped["int_1"] == 0
    assert mapped["cat_0"] == "0a1b" and mapped["cat_1"] == ""
    unlabelled = _default_row_mapper(row[1:])
    assert "label" not in unlabelled and unlabelled["int_0"] == 5
    with pytest.raises(ValueError, match="at most 40 columns"):
        _default_row_mapper(row + ["x"])


def test_workers_split_the_files(tmp_path):
    paths = []
    for day in range(3):
        paths.append(str(tmp_path / f"day_{day}"))
        with open(paths[-1], "w") as out:
            out.writelines("\t".join([str(day), *["1"] * 13, *["a"] * 26]) + "\n" for _ in range(4))
    rows = list(DataLoader(criteo_terabyte(paths), batch_size=None, num_workers=2))
    assert sorted(int(r["label"]) for r in rows) == [0] * 4 + [1] * 4 + [2] * 4
    assert len(list(criteo_kaggle(paths[0], row_mapper=None))) == 4
