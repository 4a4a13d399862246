"""safetensors files written and read a slice at a time, so that no process holds a second copy of a table.

``safetensors.torch.save_file`` turns every tensor into a ``bytes`` object before writing (a full copy of
what is saved), and ``safe_open`` maps the file, so every page read stays resident in the reading process.
Here the layout is fixed up front from each tensor's dtype and shape, tensors (or row ranges of them) are
written from their own memory with ``pwrite``, and reads ``preadv`` straight into the destination: the
extra memory is one bounded chunk, and file pages live only in the page cache. The files are ordinary
safetensors (readable by ``safe_open``); the data section starts at a multiple of ``ALIGN`` bytes (the header
is padded with spaces, as the format allows), so that a mapped tensor of the file is aligned as well as its
offset inside the data section allows.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

ALIGN = 64
CHUNK_BYTES = 32 * 2**20  # the most a read or a non-contiguous write stages at once
_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.int64: "I64",
    torch.float64: "F64",
}
_NAMES = {name: dtype for dtype, name in _DTYPES.items()}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit
_SHOWN = 200  # characters of a hostile value quoted in a message


class SafetensorsFormatError(ValueError):
    """A file is not a safetensors file this module can read (the message names the file and the field)."""


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor: its name, dtype, shape and (once laid out) its byte range in the file."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int = 0  # absolute file offset of its first byte

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _element_size(self.dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes of one index of the first dimension (the whole tensor for a scalar)."""
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def dtype_name(dtype: torch.dtype) -> str:
    """safetensors' name of a dtype this module stores ("F32", "U8", ...)."""
    return _DTYPES[dtype]


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def spec_of(name: str, tensor: Tensor) -> TensorSpec:
    return TensorSpec(name, tensor.dtype, tuple(tensor.shape))


def _as_bytes(tensor: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    flat = tensor.reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


class _RepeatedKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused if a key repeats (JSON keeps the last one, hiding the bytes of the first)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(f"key {_show(key)} appears twice")
        out[key] = value
    return out


def _show(value: Any) -> str:
    """``value`` quoted and cut short: a message shows hostile values without their control characters."""
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0  # not bool, not a float that equals an integer


def _entry(where: str, entry: Any, data_bytes: int) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    """``(dtype, shape, begin, end)`` of one header entry; SafetensorsFormatError naming ``where``."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise SafetensorsFormatError(
            f"{where}: needs 'dtype', 'shape' and 'data_offsets'; got {_show(entry)}"
        )
    name, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(name, str) or name not in _NAMES:
        raise SafetensorsFormatError(f"{where}: dtype {_show(name)} is not one of {', '.join(_NAMES)}")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise SafetensorsFormatError(
            f"{where}: shape {_show(shape)}: must be a list of non-negative integers"
        )
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(n) for n in offsets):
        raise SafetensorsFormatError(
            f"{where}: data_offsets {_show(offsets)}: must be two non-negative integers"
        )
    begin, end = offsets
    if begin > end:
        raise SafetensorsFormatError(f"{where}: data_offsets [{begin}, {end}]: begins after it ends")
    if end > data_bytes:
        raise SafetensorsFormatError(
            f"{where}: data_offsets [{begin}, {end}]: ends past the data section ({data_bytes} bytes)"
        )
    needed = math.prod(shape) * _element_size(_NAMES[name])
    if end - begin != needed:
        raise SafetensorsFormatError(
            f"{where}: data_offsets [{begin}, {end}]: {end - begin} bytes, but shape {shape} of {name} "
            f"is {needed} bytes"
        )
    return _NAMES[name], tuple(shape), begin, end


class SafetensorsWriter:
    """A safetensors file whose tensors are declared up front and then written in any order, in pieces.

    ``write(name, tensor, row_offset)`` stores ``tensor`` as rows ``row_offset..`` of the declared tensor
    ``name`` (any device and memory layout; staged through ``CHUNK_BYTES`` when not contiguous on the CPU).
    ``close()`` checks every byte was written and fsyncs. A context manager (an error removes the file).
    """

    def __init__(
        self, path: str | Path, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None
    ) -> None:
        self.path = Path(path)
        header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
        position = 0
        for spec in specs:
            if spec.dtype not in _DTYPES:
                raise SafetensorsFormatError(
                    f"{self.path}: tensor {spec.name!r}: dtype {spec.dtype} unsupported"
                )
            header[spec.name] = {
                "dtype": _DTYPES[spec.dtype],
                "shape": list(spec.shape),
                "data_offsets": [position, position + spec.nbytes],
            }
            position += spec.nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        padded = len(text) + (-(8 + len(text)) % ALIGN)
        self.data_start = 8 + padded
        self.specs = {
            s.name: TensorSpec(s.name, s.dtype, s.shape, self.data_start + header[s.name]["data_offsets"][0])
            for s in specs
        }
        self._remaining = {name: spec.nbytes for name, spec in self.specs.items()}
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        self.head = struct.pack("<Q", padded) + text.ljust(padded)  # the file's bytes before the data
        _pwrite_all(self._fd, memoryview(self.head), 0)
        os.ftruncate(self._fd, self.data_start + position)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if error is None:
            self.close()
        else:
            self.abort()

    def write(self, name: str, tensor: Tensor, row_offset: int = 0) -> None:
        """Store ``tensor`` as rows ``row_offset..`` of ``name`` (trailing dims as declared)."""
        spec = self.specs[name]
        if tensor.dtype != spec.dtype or tuple(tensor.shape[1:]) != spec.shape[1:]:
            raise SafetensorsFormatError(
                f"{self.path}: tensor {name!r}: writing {tensor.dtype} {list(tensor.shape)} into "
                f"{spec.dtype} {list(spec.shape)}"
            )
        rows = tensor.shape[0] if tensor.dim() else 1
        if row_offset + rows > (spec.shape[0] if spec.shape else 1):
            raise SafetensorsFormatError(f"{self.path}: tensor {name!r}: rows beyond {list(spec.shape)}")
        tensor = tensor.detach()
        offset = spec.start + row_offset * spec.row_bytes
        if tensor.device.type == "cpu" and tensor.is_contiguous():
            _pwrite_all(self._fd, _as_bytes(tensor), offset)
        else:
            step = max(1, CHUNK_BYTES // max(1, spec.row_bytes))
            flat = tensor.reshape(1, *tensor.shape) if tensor.dim() == 0 else tensor
            for first in range(0, rows, step):
                chunk = flat[first : first + step].to("cpu").contiguous()
                _pwrite_all(self._fd, _as_bytes(chunk), offset + first * spec.row_bytes)
        self._remaining[name] -= rows * spec.row_bytes if spec.shape else spec.nbytes

    def close(self) -> None:
        if self._fd < 0:
            return
        unwritten = [name for name, left in self._remaining.items() if left > 0]
        if unwritten:
            self.abort()
            raise SafetensorsFormatError(
                f"{self.path}: tensors {unwritten[:5]} were declared but not written"
            )
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.path.unlink(missing_ok=True)


def save_tensors(
    path: str | Path,
    tensors: Mapping[str, Tensor],
    metadata: Mapping[str, str] | None = None,
    digest: Any = None,
) -> None:
    """Write ``tensors`` as one safetensors file straight from their memory (no ``bytes`` copy); ``digest``
    (a ``hashlib`` object) is fed the file's bytes as they are written, so the file need not be read again
    to checksum it (CPU tensors; the data section is the tensors in order)."""
    with SafetensorsWriter(path, [spec_of(k, v) for k, v in tensors.items()], metadata) as writer:
        if digest is not None:
            digest.update(writer.head)
        for name, tensor in tensors.items():
            writer.write(name, tensor)
            if digest is not None:
                digest.update(_as_bytes(tensor.detach().contiguous()))


class SafetensorsFile:
    """A safetensors file's header, and reads of any rows (and columns) of its tensors with ``preadv``.

    The file is not mapped: what is read lands only in the destination tensor (and the page cache).
    """

    def __init__(self, path: str | Path, data: bytearray | None = None) -> None:
        """``data``: the file's bytes, read already (then ``path`` only names it in messages)."""
        self.path = Path(path)
        if data is None:
            self._file = open(self.path, "rb")  # noqa: SIM115 - close()
        else:  # only its header is read here: a copy of that, not of every tensor's bytes
            length = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
            self._file = io.BytesIO(bytes(memoryview(data)[: 8 + min(length, MAX_HEADER_BYTES)]))
        self._size = os.fstat(self._file.fileno()).st_size if data is None else len(data)
        try:
            self.specs, self.metadata = self._parse()
        except BaseException:
            self._file.close()
            raise

    def _parse(self) -> tuple[dict[str, TensorSpec], dict[str, str]]:
        """The header, checked: every tensor's dtype known, its shape non-negative integers, its byte range
        inside the data section and exactly its shape's size, the ranges neither overlapping nor leaving
        bytes between or after them (as safetensors requires). A file whose header lies could otherwise have
        a tensor read from the header's own bytes or from another tensor's."""
        header, data_start, data_bytes = self._read_header()
        metadata = header.pop("__metadata__", None) or {}
        specs, spans = {}, []
        for name, entry in header.items():
            dtype, shape, begin, end = _entry(f"{self.path}: tensor {_show(name)}", entry, data_bytes)
            specs[name] = TensorSpec(name, dtype, shape, data_start + begin)
            spans.append((begin, end, name))
        covered, previous = 0, None
        for begin, end, name in sorted(spans):
            if begin != covered:
                problem = (
                    f"overlaps tensor {_show(previous)}, which ends at {covered}"
                    if begin < covered
                    else f"leaves bytes [{covered}, {begin}) of the data section unused"
                )
                raise SafetensorsFormatError(
                    f"{self.path}: tensor {_show(name)}: data_offsets [{begin}, {end}]: {problem}"
                )
            covered, previous = end, name
        if covered != data_bytes:
            raise SafetensorsFormatError(
                f"{self.path}: the tensors end at byte {covered} of the data section, which holds "
                f"{data_bytes}; safetensors files have no unused bytes"
            )
        return specs, metadata

    def _read_header(self) -> tuple[dict[str, Any], int, int]:
        """The header's JSON object, the data section's first file offset and its size in bytes."""
        unreadable = f"{self.path}: cannot be read as safetensors:"
        size = self._size
        head = self._file.read(8)
        if len(head) < 8:
            raise SafetensorsFormatError(f"{unreadable} {size} bytes, too short for a header")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise SafetensorsFormatError(
                f"{unreadable} header length {length} exceeds the file ({size} bytes) or safetensors' "
                f"limit ({MAX_HEADER_BYTES} bytes)"
            )
        try:
            header = json.loads(self._file.read(length).decode("utf-8"), object_pairs_hook=_unique_keys)
        except _RepeatedKey as error:
            raise SafetensorsFormatError(f"{self.path}: header: {error}") from None
        except RecursionError:
            raise SafetensorsFormatError(f"{unreadable} its header is nested too deeply") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SafetensorsFormatError(f"{unreadable} its header is not JSON ({error})") from None
        if not isinstance(header, dict):
            raise SafetensorsFormatError(f"{unreadable} its header is not a JSON object")
        return header, 8 + length, size - 8 - length

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def spec(self, name: str) -> TensorSpec:
        if name not in self.specs:
            raise KeyError(name)
        return self.specs[name]

    def _read_bytes(self, out: Tensor, offset: int) -> None:
        view, fd = _as_bytes(out), self._file.fileno()
        while len(view):
            got = os.preadv(fd, [view], offset)
            if got <= 0:
                raise SafetensorsFormatError(f"{self.path}: ends before byte {offset + len(view)}")
            view, offset = view[got:], offset + got

    def read(self, name: str) -> Tensor:
        """A whole tensor, newly allocated."""
        spec = self.spec(name)
        out = torch.empty(spec.shape, dtype=spec.dtype)
        self._read_bytes(out, spec.start)
        return out

    def read_rows(self, name: str, first: int, count: int) -> Tensor:
        """Rows ``first..first+count`` of a tensor (its first dimension), newly allocated."""
        spec = self.spec(name)
        out = torch.empty((count, *spec.shape[1:]), dtype=spec.dtype)
        self._read_bytes(out, spec.start + first * spec.row_bytes)
        return out

    def read_into(
        self, name: str, out: Tensor, rows: tuple[int, int], cols: tuple[int, int] | None = None
    ) -> None:
        """Copy rows ``rows[0]..rows[1]`` (and, of a 2-D tensor, columns ``cols``) into ``out``.

        Straight into ``out`` when it is a contiguous CPU tensor taking whole rows; otherwise through chunks
        of at most ``CHUNK_BYTES``."""
        spec = self.spec(name)
        first, end = rows
        whole_rows = cols is None or (cols[0] == 0 and cols[1] == spec.shape[1])
        if whole_rows and out.device.type == "cpu" and out.is_contiguous() and out.dtype == spec.dtype:
            self._read_bytes(out, spec.start + first * spec.row_bytes)
            return
        step = max(1, CHUNK_BYTES // max(1, spec.row_bytes))
        for start in range(first, end, step):
            count = min(step, end - start)
            chunk = self.read_rows(name, start, count)
            if not whole_rows:
                chunk = chunk[:, cols[0] : cols[1]]
            out[start - first : start - first + count].copy_(chunk)


def tensors_of_bytes(data: bytearray, path: str | Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file's bytes ``data`` (read from ``path``), its header checked as
    :class:`SafetensorsFile` checks it; views of ``data``, nothing copied (a reader that must hash what it
    loads reads the bytes once, hashes them, and parses them here)."""
    with SafetensorsFile(path, data) as parsed:
        out = {}
        for name, spec in parsed.specs.items():
            count = math.prod(spec.shape)
            if count == 0:
                out[name] = torch.empty(spec.shape, dtype=spec.dtype)
                continue
            flat = torch.frombuffer(data, dtype=spec.dtype, count=count, offset=spec.start)
            out[name] = flat.view(spec.shape)
        return out
