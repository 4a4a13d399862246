"""Part files are plain safetensors: the safetensors library reads what we write, and we read what it writes.

The part writer streams and hashes in one pass and the reader maps the file without copying, which the
library's numpy API does not offer; these tests hold the two to the library's format.
"""

from __future__ import annotations

import hashlib

import numpy as np
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from rectrain.datasets.columnar.part_files import read_part, write_part

DTYPES = [np.float32, np.int32, np.int64]


@st.composite
def tensors(draw):
    names = draw(st.lists(st.sampled_from(["label", "dense", "sparse", "extra"]), min_size=1, unique=True))
    rows = draw(st.integers(0, 20))
    out = {}
    for name in names:
        dtype = draw(st.sampled_from(DTYPES))
        cols = draw(st.integers(1, 5))
        values = draw(st.lists(st.integers(-1000, 1000), min_size=rows * cols, max_size=rows * cols))
        out[name] = np.array(values, dtype=dtype).reshape(rows, cols)
    return out


@settings(max_examples=30, deadline=None)
@given(arrays=tensors())
def test_the_library_reads_our_parts_and_we_read_its_files(tmp_path_factory, arrays):
    tmp = tmp_path_factory.mktemp("parts")
    ours = tmp / "ours.safetensors"
    digest = write_part(ours, arrays)
    assert digest.sha256 == hashlib.sha256(ours.read_bytes()).hexdigest()
    assert digest.bytes == ours.stat().st_size
    loaded = safetensors.numpy.load_file(str(ours))
    assert loaded.keys() == arrays.keys()
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
        assert loaded[name].dtype == array.dtype

    theirs = tmp / "theirs.safetensors"
    safetensors.numpy.save_file(arrays, str(theirs))
    read = read_part(theirs)
    assert read.keys() == arrays.keys()
    for name, array in arrays.items():
        np.testing.assert_array_equal(read[name], array)
        assert read[name].dtype == array.dtype
