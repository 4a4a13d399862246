"""Part files of converted data: safetensors written as a stream (hashed as written), read back memory-mapped.

safetensors is the project's tensor format: an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and byte range, then the raw little-endian bytes; no code is ever unpickled.
Reading maps the file, so a batch costs a copy of its own rows and nothing more, and the ranks of a host
share the page cache.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rectrain.durable import fsync_path
from rectrain.errors import RecTrainError

_DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8")}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 1 << 20


class DataFormatError(RecTrainError):
    """A converted data file, its manifest or a Parquet file is missing, truncated, altered or not ours; the
    message names it (a missing text input is ``rows.DataFileError``)."""


@dataclass(frozen=True)
class FileDigest:
    """A written file's size and sha256."""

    bytes: int
    sha256: str


def write_part(path: Path, tensors: Mapping[str, np.ndarray]) -> FileDigest:
    """Write ``tensors`` to ``path`` as safetensors (temp file, fsync, rename); return its size and sha256."""
    header: dict[str, dict] = {}
    offset = 0
    arrays = {}
    for name, array in tensors.items():
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        if array.dtype not in _NAMES:
            raise ValueError(f"write_part: {name} has dtype {array.dtype}; expected float32, int32 or int64")
        arrays[name] = array
        header[name] = {
            "dtype": _NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned
    digest = hashlib.sha256()
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        for piece in (struct.pack("<Q", len(text)), text, *(a.data for a in arrays.values())):
            f.write(piece)
            digest.update(piece)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
    return FileDigest(bytes=8 + len(text) + offset, sha256=digest.hexdigest())


def read_part(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a part file as read-only arrays over a memory map; ``DataFormatError`` if malformed."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise DataFormatError(f"{path}: cannot read ({e.strerror}); re-run `rectrain data convert`") from None
    if size < 8:
        raise DataFormatError(f"{path}: {size} bytes is not a safetensors file (truncated?)")
    (length,) = struct.unpack("<Q", mapped[:8])
    if not 2 <= length <= min(_MAX_HEADER, size - 8):
        raise DataFormatError(f"{path}: header length {length} does not fit the file of {size} bytes")
    try:
        header = json.loads(bytes(mapped[8 : 8 + length]))
    except ValueError:
        raise DataFormatError(f"{path}: header is not JSON (not a safetensors file?)") from None
    header.pop("__metadata__", None)
    return {name: _tensor(path, mapped, 8 + length, size, name, entry) for name, entry in header.items()}


def _tensor(path: Path, mapped, start: int, size: int, name: str, entry: dict) -> np.ndarray:
    try:
        dtype = _DTYPES[entry["dtype"]]
        shape = [int(d) for d in entry["shape"]]
        begin, end = (int(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise DataFormatError(
            f"{path}: tensor {name!r} has an unsupported or malformed header entry"
        ) from None
    count = int(np.prod(shape, dtype=np.int64))
    if min(shape, default=0) < 0 or end - begin != count * dtype.itemsize or start + end > size or begin < 0:
        raise DataFormatError(f"{path}: tensor {name!r} (shape {shape}) does not fit its bytes; truncated?")
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=start + begin).reshape(shape)
