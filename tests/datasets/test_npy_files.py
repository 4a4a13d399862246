"""Headers and row ranges of .npy files read without loading the array; local files only."""

import numpy as np
import pytest

from rectrain.datasets.npy_files import get_shape_from_npy, load_npy_range, open_file


def test_shape_and_row_ranges(tmp_path):
    path = str(tmp_path / "a.npy")
    array = np.arange(40, dtype=np.int32).reshape(10, 4)
    np.save(path, array)
    assert get_shape_from_npy(path) == (10, 4)
    np.testing.assert_array_equal(load_npy_range(path, 3, 4), array[3:7])
    np.testing.assert_array_equal(load_npy_range(path, 3, 4, mmap_mode=True), array[3:7])
    with pytest.raises(ValueError, match="exceeds"):
        load_npy_range(path, 8, 3)


def test_another_path_manager_is_refused(tmp_path):
    with pytest.raises(ValueError, match="local files only"):
        open_file(str(tmp_path / "a"), "w", path_manager_key="manifold")
