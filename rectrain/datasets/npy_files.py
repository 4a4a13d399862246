"""Files of TorchRec's dataset helpers: local paths, and ``.npy`` headers and row ranges read without loading
the whole array.

TorchRec opens dataset files through iopath's ``PathManager`` chosen by ``path_manager_key`` (default
``"torchrec"``: the local file system). rectrain reads local files; another key (a remote store) is refused
by name rather than read from the wrong place.
"""

import os
from typing import IO, Any

import numpy as np

PATH_MANAGER_KEY = "torchrec"


def check_path_manager(path_manager_key: str) -> None:
    if path_manager_key != PATH_MANAGER_KEY:
        raise ValueError(
            f"path_manager_key={path_manager_key!r}: rectrain reads local files only "
            f"(TorchRec's default key {PATH_MANAGER_KEY!r}); copy the files locally first"
        )


def open_file(path: str, mode: str, path_manager_key: str = PATH_MANAGER_KEY, **open_kw: Any) -> IO:
    check_path_manager(path_manager_key)
    return open(path, mode, **open_kw)


def npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from an ``.npy`` header; ``stream`` is left at the first byte of the data."""
    major, _minor = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, _fortran_order, dtype = read(stream)
    return shape, dtype


def get_shape_from_npy(path: str, path_manager_key: str = PATH_MANAGER_KEY) -> tuple[int, ...]:
    """The shape of the array in an ``.npy`` file, from its header alone."""
    with open_file(path, "rb", path_manager_key) as stream:
        return npy_header(stream)[0]


def load_npy_range(
    fname: str,
    start_row: int,
    num_rows: int,
    path_manager_key: str = PATH_MANAGER_KEY,
    mmap_mode: bool = False,
) -> np.ndarray:
    """Rows ``[start_row, start_row + num_rows)`` of a 2-D ``.npy`` array, reading only those bytes
    (``mmap_mode``: a view of a read-only memory map instead)."""
    with open_file(fname, "rb", path_manager_key) as stream:
        shape, dtype = npy_header(stream)
        if len(shape) != 2:
            raise ValueError(f"{fname}: can only load row ranges of 2-D arrays, this one has shape {shape}")
        total_rows, row_size = shape
        if not 0 <= start_row < total_rows:
            raise ValueError(f"start_row ({start_row}) must lie in [0, {total_rows - 1}]")
        if start_row + num_rows > total_rows:
            raise ValueError(
                f"num_rows ({num_rows}) from start_row {start_row} exceeds the {total_rows} rows"
            )
        if mmap_mode:
            data = np.load(fname, mmap_mode="r")[start_row : start_row + num_rows]
        else:
            stream.seek(start_row * row_size * dtype.itemsize, os.SEEK_CUR)
            data = np.fromfile(stream, dtype=dtype, count=num_rows * row_size)
        return data.reshape((num_rows, row_size))


def save_npy(path: str, array: np.ndarray, path_manager_key: str = PATH_MANAGER_KEY) -> None:
    with open_file(path, "wb", path_manager_key) as stream:
        np.save(stream, array)
