"""Read a ``torch.distributed.checkpoint`` (DCP) directory without unpickling anything we do not know.

A DCP directory holds ``.metadata`` (a pickle of ``torch.distributed.checkpoint.metadata.Metadata``) and
``*.distcp`` data files. The metadata gives every tensor's full size and its chunks (offsets, sizes), and per
chunk a byte range in a data file, which the default ``FileSystemWriter`` fills with ``torch.save`` of the
chunk. So the reader:

1. unpickles ``.metadata`` with ``_MetadataUnpickler``, whose ``find_class`` admits only the DCP metadata
   classes, ``torch.Size``, torch dtypes and layouts, and paths; any other global (``os.system``,
   ``builtins.eval``...) is refused with ``ExportError`` naming it, before any of it runs;
2. checks the metadata's shapes (chunks inside their tensor, covering it exactly once; byte ranges inside
   files of the directory);
3. reads each requested chunk's bytes and ``torch.load(..., weights_only=True)``s them (or, for files
   written with ``serialization_format=SAFETENSORS``, reads the chunk with safetensors), and copies them into
   the full tensor at their offsets.

Any sharding TorchRec writes (table-wise, column-wise, row-wise, table-row-wise, data-parallel, any world
size) is a set of chunks, so the assembly does not need to know which one it was.
"""

from __future__ import annotations

import io
import json
import math
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from recserve.errors import ExportError

METADATA_FILE = ".metadata"

_DCP = "torch.distributed.checkpoint.metadata"
_ALLOWED_GLOBALS = {
    (_DCP, "Metadata"),
    (_DCP, "TensorStorageMetadata"),
    (_DCP, "BytesStorageMetadata"),
    (_DCP, "ChunkStorageMetadata"),
    (_DCP, "TensorProperties"),
    (_DCP, "MetadataIndex"),
    (_DCP, "StorageMeta"),
    (_DCP, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # how torch pickles a torch.layout (by name)
    ("collections", "OrderedDict"),
    # StorageMeta.checkpoint_id is the path the checkpoint was saved to.
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
    ("pathlib._local", "PosixPath"),
    ("pathlib._local", "WindowsPath"),
    ("pathlib._local", "PurePosixPath"),
    ("pathlib._local", "PureWindowsPath"),
}
_TORCH_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)}
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of a DCP ``.metadata`` file (see the module docstring)."""

    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ALLOWED_GLOBALS or (module == "torch" and name in _TORCH_DTYPES):
            return super().find_class(module, name)
        raise ExportError(
            f"{self._source}: refusing to unpickle global {module}.{name}: a DCP metadata file holds only "
            "torch.distributed.checkpoint metadata classes, so this file is not one (or was tampered with)"
        )

    def persistent_load(self, pid: object) -> object:
        raise ExportError(f"{self._source}: unexpected persistent id {pid!r:.60} in a DCP metadata file")


def read_metadata(checkpoint_dir: str | Path) -> object:
    """The ``Metadata`` of the DCP checkpoint at ``checkpoint_dir``, unpickled with the allow-list only."""
    path = Path(checkpoint_dir) / METADATA_FILE
    if not path.is_file():
        raise ExportError(
            f"{checkpoint_dir}: no {METADATA_FILE} file; expected a directory written by "
            "torch.distributed.checkpoint.save"
        )
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes()), str(path)).load()
    except ExportError:
        raise
    except Exception as error:  # a truncated or garbled pickle fails in many ways; all mean "not metadata"
        raise ExportError(
            f"{path}: not a readable DCP metadata file ({type(error).__name__}: {error})"
        ) from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise ExportError(f"{path}: holds a {type(metadata).__name__}, expected a DCP Metadata")
    return metadata


@dataclass(frozen=True)
class _Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    start: int
    length: int


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a DCP checkpoint: its full ``size``, ``dtype`` and the chunks that hold it."""

    fqn: str
    size: tuple[int, ...]
    dtype: torch.dtype
    chunks: tuple[_Chunk, ...]


class DcpCheckpoint:
    """A DCP checkpoint directory: ``entries`` (tensors by fully-qualified name) and ``read(fqns)``.

    Non-tensor entries (``BytesStorageMetadata``: pickled Python objects such as a step counter) are listed
    in ``skipped`` and never read.
    """

    def __init__(self, checkpoint_dir: str | Path) -> None:
        self.path = Path(checkpoint_dir)
        metadata = read_metadata(self.path)
        try:
            self.entries, self.skipped = _entries(metadata, self.path)
        except (AttributeError, TypeError, ValueError) as error:  # admitted classes, unexpected contents
            if isinstance(error, ExportError):
                raise
            raise ExportError(
                f"{self.path}: malformed DCP metadata ({type(error).__name__}: {error})"
            ) from None

    def read(self, fqns: Iterable[str]) -> dict[str, Tensor]:
        """The full tensors ``fqns`` (each assembled from its chunks), in the dtype they were saved in."""
        out = {}
        for fqn in fqns:
            if fqn not in self.entries:
                raise ExportError(f"{self.path}: the checkpoint has no tensor {fqn!r}")
            out[fqn] = self._assemble(self.entries[fqn])
        return out

    def _assemble(self, entry: TensorEntry) -> Tensor:
        full = torch.empty(entry.size, dtype=entry.dtype)
        for chunk in entry.chunks:
            data = self._load_chunk(entry, chunk)
            view = full
            for dim, (offset, size) in enumerate(zip(chunk.offsets, chunk.sizes)):
                view = view.narrow(dim, offset, size)
            view.copy_(data)
        return full

    def _load_chunk(self, entry: TensorEntry, chunk: _Chunk) -> Tensor:
        where = f"{self.path / chunk.file} bytes [{chunk.start}, {chunk.start + chunk.length}) ({entry.fqn})"
        with open(self.path / chunk.file, "rb") as f:
            header = f.read(9)
            f.seek(chunk.start)
            raw = f.read(chunk.length)
        if len(raw) != chunk.length:
            raise ExportError(f"{where}: the file ends early (truncated checkpoint)")
        if raw.startswith(_ZIP_MAGIC):
            tensor = _torch_load(raw, where)
        elif header[8:9] == b"{":  # a safetensors header: FileSystemWriter(serialization_format=SAFETENSORS)
            tensor = _safetensors_chunk(self.path / chunk.file, entry.fqn, chunk.offsets, where)
        else:
            raise ExportError(
                f"{where}: neither a torch.save item nor a safetensors file, the two formats of DCP's "
                "FileSystemWriter (without stream extensions)"
            )
        if tuple(tensor.shape) != chunk.sizes or tensor.dtype != entry.dtype:
            raise ExportError(
                f"{where}: holds {tensor.dtype} {tuple(tensor.shape)}, the metadata says {entry.dtype} "
                f"{chunk.sizes}"
            )
        return tensor


def _torch_load(raw: bytes, where: str) -> Tensor:
    try:
        tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as error:  # weights_only refuses anything but tensors; corrupt zips fail variously
        raise ExportError(f"{where}: cannot read ({type(error).__name__}: {error})") from None
    if not isinstance(tensor, Tensor):
        raise ExportError(f"{where}: holds a {type(tensor).__name__}, expected a tensor")
    return tensor


def _safetensors_chunk(path: Path, fqn: str, offsets: tuple[int, ...], where: str) -> Tensor:
    """``fqn``'s chunk from a DCP safetensors data file (one chunk per name and file, offsets recorded)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            sharding = json.loads((f.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
            if fqn not in f.keys():  # noqa: SIM118 - safe_open is no dict
                raise ExportError(f"{where}: the safetensors file has no {fqn!r}")
            saved = sharding.get(fqn, {}).get("saved_offsets")
            if saved is not None and tuple(saved) != offsets:
                raise ExportError(f"{where}: the file holds the chunk at {tuple(saved)}, not {offsets}")
            return f.get_tensor(fqn)
    except (SafetensorError, json.JSONDecodeError, AttributeError) as error:
        raise ExportError(f"{where}: not a readable safetensors file ({error})") from None


def _entries(metadata: object, root: Path) -> tuple[dict[str, TensorEntry], list[str]]:
    """Checked ``TensorEntry`` per tensor of ``metadata`` and the names of the non-tensor entries."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise ExportError(
            f"{root}: the metadata has no storage index (storage_data {type(storage).__name__})"
        )
    entries: dict[str, TensorEntry] = {}
    skipped: list[str] = []
    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            skipped.append(str(fqn))
            continue
        size = tuple(int(s) for s in item.size)
        chunks = []
        for position, chunk in enumerate(item.chunks):
            offsets, sizes = tuple(int(o) for o in chunk.offsets), tuple(int(s) for s in chunk.sizes)
            info = storage.get(MetadataIndex(fqn, offsets))
            if info is None:
                raise ExportError(f"{root}: {fqn} chunk at {offsets} has no storage entry in the metadata")
            file, start, length = _check_storage(info, root, f"{fqn} chunk at {offsets}")
            chunks.append(_Chunk(offsets, sizes, file, start, length))
            _check_chunk(size, offsets, sizes, f"{root}: {fqn} chunk {position}")
        _check_coverage(size, chunks, f"{root}: {fqn}")
        entries[fqn] = TensorEntry(fqn, size, item.properties.dtype, tuple(chunks))
    return entries, skipped


def _check_storage(info: object, root: Path, where: str) -> tuple[str, int, int]:
    file = getattr(info, "relative_path", None)
    start, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not isinstance(file, str) or not isinstance(start, int) or not isinstance(length, int):
        raise ExportError(f"{root}: {where}: malformed storage entry {info!r:.120}")
    if getattr(info, "transform_descriptors", None):
        raise ExportError(
            f"{root}: {where}: written through stream extensions {list(info.transform_descriptors)} "
            "(e.g. compression), which export does not read; save without _extensions"
        )
    path = (root / file).resolve()
    if Path(file).is_absolute() or root.resolve() not in path.parents:
        raise ExportError(f"{root}: {where}: data file {file!r} is outside the checkpoint directory")
    if not path.is_file():
        raise ExportError(f"{root}: {where}: data file {file} is missing")
    if start < 0 or length <= 0 or start + length > path.stat().st_size:
        raise ExportError(
            f"{root}: {where}: byte range [{start}, {start + length}) is outside {file} "
            f"({path.stat().st_size} bytes)"
        )
    return file, start, length


def _check_chunk(size: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...], where: str) -> None:
    if len(offsets) != len(size) or len(sizes) != len(size):
        raise ExportError(f"{where}: offsets {offsets} / sizes {sizes} do not match the tensor's rank {size}")
    for dim, (offset, extent, total) in enumerate(zip(offsets, sizes, size)):
        if offset < 0 or extent < 0 or offset + extent > total:
            raise ExportError(f"{where}: dim {dim} spans [{offset}, {offset + extent}), outside 0..{total}")


def _check_coverage(size: tuple[int, ...], chunks: list[_Chunk], where: str) -> None:
    """The chunks cover the tensor exactly once: volumes add up and no two chunks overlap."""
    volume = sum(math.prod(c.sizes) for c in chunks)
    if volume != math.prod(size):
        raise ExportError(
            f"{where}: its chunks hold {volume} elements, the tensor {size} has {math.prod(size)}; "
            "the checkpoint is incomplete (were all ranks' files copied?)"
        )
    for i, a in enumerate(chunks):
        for b in chunks[i + 1 :]:
            if all(
                max(ao, bo) < min(ao + asz, bo + bsz)
                for ao, asz, bo, bsz in zip(a.offsets, a.sizes, b.offsets, b.sizes)
            ):
                raise ExportError(f"{where}: chunks at {a.offsets} and {b.offsets} overlap")
