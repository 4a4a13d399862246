"""The model package on disk: ``manifest.json`` plus safetensors files (see docs/package-format.md).

    <package>/manifest.json              format version, model config, features, tables, placement, checksums
    <package>/dense.safetensors          the dense part's state dict (prediction-module names)
    <package>/embeddings_<i>.safetensors the table shards served by placement device i

Shard ``table[start:end]`` is stored as ``"table[start:end].rows"``: FBGEMM's CPU kernel rows (scale/bias then
codes, see ``layout``), which the runtime maps read-only instead of copying, so every worker and every reload
of an unchanged file share one copy in the page cache. Format version 1 stored ``"table[start:end].weights"``
and ``".scale_bias"`` apart; such packages still load (copied into the kernels). Nothing is pickled and no
code is stored: the runtime rebuilds the model from ``model_config``. This module reads and verifies (the
manifest, every file's sha256, every safetensors header); ``recserve.export`` writes.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import Tensor

from recserve.errors import PackageError
from recserve.runtime import pruning
from recserve.runtime.layout import QuantizedTable, TableDType
from recserve.runtime.placement import ServingPlacement, TableShard
from recserve.runtime.pruning import stored_rows
from rectrain.durable import sha256_file
from rectrain.safetensors_io import SafetensorsFile, SafetensorsFormatError, dtype_name

logger = logging.getLogger(__name__)

FORMAT_NAME = "recserve-model-package"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2, 3)  # 1: weights and scale_bias stored apart (copied at load); 3: pruned
MANIFEST_FILE = "manifest.json"
DENSE_FILE = "dense.safetensors"
MAX_VERSION = 2**63 - 1  # Triton's version directories are int64s


def version_problem(version: str) -> str | None:
    """Why ``version`` cannot name a model version (None if it can): a version is ASCII digits, as Triton's
    numeric version directories, so that it is the same string in a folder name, a URL, a metric label and
    a log line (``str.isdigit`` alone also takes digits such as '²' that ``int`` refuses)."""
    if not (version.isascii() and version.isdigit()):
        return f"version {version[:40]!r} must be digits only (as a Triton version directory), e.g. '1'"
    if int(version) > MAX_VERSION:
        return f"version {version[:40]!r} exceeds {MAX_VERSION} (Triton versions are int64)"
    return None


def embeddings_file(device_index: int) -> str:
    return f"embeddings_{device_index}.safetensors"


def weights_key(shard: TableShard) -> str:
    return f"{shard.label}.weights"


def scale_bias_key(shard: TableShard) -> str:
    return f"{shard.label}.scale_bias"


def rows_key(shard: TableShard) -> str:
    return f"{shard.label}.rows"


@dataclass(frozen=True)
class TableEntry:
    """One table as served: its config fields the runtime needs and its storage dtype and size."""

    name: str
    num_embeddings: int
    embedding_dim: int
    dtype: TableDType
    nbytes: int


@dataclass
class PackageManifest:
    """The parsed ``manifest.json``. ``files`` maps each file name to ``{"sha256": hex, "bytes": n}``."""

    model_name: str
    version: str
    model_config: dict[str, Any]
    feature_names: list[str]
    weighted_features: list[str]
    dense_in_features: int
    dense_dtype: str
    tables: list[TableEntry]
    placement: ServingPlacement
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    dense_bounds: dict[str, Any] | None = None  # see recserve.runtime.dense_bounds
    pruning: dict[str, Any] | None = None  # see recserve.runtime.pruning
    format_version: int = FORMAT_VERSION

    def table(self, name: str) -> TableEntry:
        return next(entry for entry in self.tables if entry.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "model_name": self.model_name,
            "version": self.version,
            "model_config": self.model_config,
            "feature_names": list(self.feature_names),
            "weighted_features": list(self.weighted_features),
            "dense_in_features": self.dense_in_features,
            "dense_dtype": self.dense_dtype,
            "tables": [
                {
                    "name": t.name,
                    "num_embeddings": t.num_embeddings,
                    "embedding_dim": t.embedding_dim,
                    "dtype": t.dtype.value,
                    "bytes": t.nbytes,
                }
                for t in self.tables
            ],
            "placement": self.placement.to_dict(),
            "source": self.source,
            "accuracy": self.accuracy,
            "dense_bounds": self.dense_bounds,
            **({"pruning": self.pruning} if self.pruning is not None else {}),
            "files": self.files,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = MANIFEST_FILE) -> PackageManifest:
        """Parse a manifest; PackageError naming ``where`` and the key on anything missing or malformed."""
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise PackageError(
                f"{where}: not a recserve model package manifest (no 'format': {FORMAT_NAME!r})"
            )
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise PackageError(
                f"{where}: format_version {version!r} is not supported by this recserve (reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}); re-export the package with this version"
            )
        try:
            tables = [
                TableEntry(
                    str(t["name"]),
                    int(t["num_embeddings"]),
                    int(t["embedding_dim"]),
                    TableDType(t["dtype"]),
                    int(t["bytes"]),
                )
                for t in data["tables"]
            ]
            if data.get("pruning") is not None and version < pruning.PRUNED_FORMAT_VERSION:
                raise PackageError(f"{where}: a pruned package has format_version >= 3, not {version}")
            version_text = str(data["version"])
            problem = version_problem(version_text)
            if problem:
                raise PackageError(f"{where}: {problem}; re-export the package with --version N")
            return cls(
                model_name=str(data["model_name"]),
                version=version_text,
                model_config=dict(data["model_config"]),
                feature_names=[str(f) for f in data["feature_names"]],
                weighted_features=[str(f) for f in data["weighted_features"]],
                dense_in_features=int(data["dense_in_features"]),
                dense_dtype=str(data["dense_dtype"]),
                tables=tables,
                placement=ServingPlacement.from_dict(data["placement"], f"{where}: placement"),
                files={str(k): dict(v) for k, v in data["files"].items()},
                source=data.get("source"),
                accuracy=data.get("accuracy"),
                dense_bounds=data.get("dense_bounds"),
                pruning=_pruning(data.get("pruning"), where),
                format_version=version,
            )
        except KeyError as error:
            raise PackageError(f"{where}: missing key {error.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as error:
            raise PackageError(f"{where}: malformed manifest ({error})") from None


def _pruning(data: Any, where: str) -> dict[str, Any] | None:
    if data is None:
        return None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("tables"), dict)
        and isinstance(data.get("shards"), dict)
    ):
        raise PackageError(f"{where}: pruning: expected an object with 'tables' and 'shards'")
    return data


def read_manifest(package_dir: str | Path) -> PackageManifest:
    """The package's manifest, parsed; PackageError naming the file if it is missing or malformed."""
    path = Path(package_dir) / MANIFEST_FILE
    if not Path(package_dir).is_dir():
        raise PackageError(f"{package_dir}: model package directory does not exist")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PackageError(f"{path}: missing; a model package needs its manifest.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PackageError(f"{path}: not valid JSON ({error})") from None
    except RecursionError:  # json.loads recurses once per nested array or object
        raise PackageError(f"{path}: nested too deeply to be a model package manifest") from None
    return PackageManifest.from_dict(data, where=str(path))


def verify_files(package_dir: str | Path, manifest: PackageManifest) -> None:
    """Check that the package holds exactly the files the manifest lists, each with its size and sha256.

    Nothing in a package escapes the check: a manifest that lists no file, a listed name that is not a plain
    file name, a listed file that is missing, and a file (or folder) beside the manifest that it does not
    list are all refused, as is any file whose bytes differ from the record.
    """
    verify_listed_files(package_dir, manifest.files)


def verify_listed_files(
    directory: str | Path,
    files: dict[str, dict[str, Any]],
    folders: tuple[str, ...] = (),
    *,
    hashes: bool = True,
) -> None:
    """``verify_files`` for any directory whose ``manifest.json`` lists ``files`` (a package, a delta);
    ``folders``: sub-directories the caller verifies itself (a pipeline's stage packages); ``hashes=False``:
    all but the sha256, for a caller that hashes the bytes as it reads them (one read, not two)."""
    where = Path(directory) / MANIFEST_FILE
    if not files:
        raise PackageError(
            f"{where}: 'files' lists no file, so nothing in the package could be verified; re-export it"
        )
    for name in files:
        if name in ("", ".", "..", MANIFEST_FILE) or "/" in name or "\\" in name:
            raise PackageError(f"{where}: files[{name!r}]: not a file name inside the package")
    present = {p.name for p in Path(directory).iterdir() if p.name != MANIFEST_FILE}
    unlisted = sorted(present - set(files) - {f for f in folders if (Path(directory) / f).is_dir()})
    if unlisted:
        raise PackageError(
            f"{Path(directory) / unlisted[0]}: not listed in {MANIFEST_FILE}, so it cannot be verified; "
            "a package holds only the files its manifest lists (remove it or re-export the package)"
        )
    for name, entry in files.items():
        if not isinstance(entry, dict):
            raise PackageError(f"{where}: files[{name!r}]: expected {{'sha256': ..., 'bytes': ...}}")
        path = Path(directory) / name
        if not path.is_file():
            raise PackageError(f"{path}: missing (listed in {MANIFEST_FILE})")
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise PackageError(f"{path}: {size} bytes, but {MANIFEST_FILE} records {entry.get('bytes')}")
        if not hashes:
            continue
        digest = sha256_file(path)
        if digest != entry.get("sha256"):
            raise PackageError(
                f"{path}: sha256 {digest} does not match {MANIFEST_FILE} ({entry.get('sha256')}); the file "
                "is corrupt or was changed after export"
            )


# Safetensors headers. A file's sha256 only proves that it is the file its author listed, and an author can
# list one whose header points a tensor at the header's own bytes (a negative offset) or at another tensor's;
# the table files are mapped here, not through safetensors. So every header is checked by the project's
# reader (``rectrain.safetensors_io``, which names the tensor and the problem) before a tensor is taken from
# it, then opened by ``safetensors.safe_open`` (which maps the file without reading it) so that the
# library's own rules have the last word.


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a checked header: ``start`` is the absolute file offset of its first byte."""

    dtype: str  # safetensors' name of it, e.g. "U8"
    shape: tuple[int, ...]
    start: int
    nbytes: int


def check_safetensors_file(path: str | Path) -> dict[str, StoredTensor]:
    """The tensors of the safetensors file ``path``, after checking its header without reading the data
    (``SafetensorsFile`` and then ``safe_open``); PackageError naming the file, the tensor and the problem."""
    path = Path(path)
    try:
        with SafetensorsFile(path) as stored:
            specs = stored.specs
    except SafetensorsFormatError as error:
        raise PackageError(str(error)) from None
    except OSError as error:
        raise PackageError(f"{path}: cannot be read ({error.strerror or error})") from None
    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as error:
        raise PackageError(f"{path}: refused by safetensors ({str(error)[:200]!r})") from None
    return {
        name: StoredTensor(dtype_name(spec.dtype), spec.shape, spec.start, spec.nbytes)
        for name, spec in specs.items()
    }


def _load(path: Path) -> dict[str, Tensor]:
    check_safetensors_file(path)  # safetensors would refuse a bad header too, but without naming the tensor
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise PackageError(f"{path}: cannot be read as safetensors ({error})") from None


def _take(tensors: dict[str, Tensor], key: str, path: Path) -> Tensor:
    if key not in tensors:
        raise PackageError(f"{path}: has no tensor {key!r}")
    return tensors[key]


def map_file(path: Path) -> dict[str, Tensor]:
    """Every tensor of a safetensors file as a read-only view of the file mapped into memory (``MAP_PRIVATE``:
    pages come from the page cache and stay shared with every other process mapping the file).

    The header is checked first (``check_safetensors_file``): the views are cut where it says, so a byte
    range outside the data section, or shared with another tensor, would serve other bytes as a table."""
    stored = check_safetensors_file(path)
    try:
        size = path.stat().st_size
        flat = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8) if size else None
    except (OSError, RuntimeError) as error:
        raise PackageError(f"{path}: cannot be read as safetensors ({error})") from None
    views = {}
    for name, spec in stored.items():
        if spec.dtype == "U8" and flat is not None:
            views[name] = flat[spec.start : spec.start + spec.nbytes].view(spec.shape)
    return views


def _warn_if_larger_than_memory(package_dir: str | Path, manifest: PackageManifest) -> None:
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return
    tables = sum(entry.nbytes for entry in manifest.tables)
    if tables > 0.8 * memory:
        logger.warning(
            "%s: the tables (%.1f GB) exceed 80%% of this machine's memory (%.1f GB); they are served from "
            "the page cache, and lookups of rows not in it read the disk (see docs/serving.md)",
            package_dir,
            tables / 1e9,
            memory / 1e9,
        )


def load_shards(package_dir: str | Path, manifest: PackageManifest) -> dict[TableShard, QuantizedTable]:
    """Every table shard of the package, in serving layout, on CPU: views of the mapped files (format 2),
    or copies read from them (format 1)."""
    shards: dict[TableShard, QuantizedTable] = {}
    mapped = manifest.format_version >= 2
    if mapped:
        _warn_if_larger_than_memory(package_dir, manifest)
    for index, device in enumerate(manifest.placement.devices):
        on_device = [s for s in manifest.placement.shards if s.device == device]
        if not on_device:
            continue
        path = Path(package_dir) / embeddings_file(index)
        tensors = map_file(path) if mapped else _load(path)
        for shard in on_device:
            entry = manifest.table(shard.table)
            if mapped:
                rows = _take(tensors, rows_key(shard), path)
                table = QuantizedTable.from_kernel_rows(rows, entry.dtype, entry.embedding_dim)
                stored = stored_rows(manifest.pruning, shard, f"{Path(package_dir) / MANIFEST_FILE}")
                shards[shard] = _checked(table, path, shard, stored)
                continue
            scale_bias = _take(tensors, scale_bias_key(shard), path) if entry.dtype.is_integer else None
            table = QuantizedTable(
                _take(tensors, weights_key(shard), path), scale_bias, entry.dtype, entry.embedding_dim
            )
            shards[shard] = _checked(table, path, shard)
    return shards


def _checked(table: QuantizedTable, path: Path, shard: TableShard, rows: int | None = None) -> QuantizedTable:
    try:
        table.check(f"{path}: {shard.label}", shard.num_rows if rows is None else rows)
    except ValueError as error:
        raise PackageError(str(error)) from None
    return table


def load_remaps(package_dir: str | Path, manifest: PackageManifest) -> dict[TableShard, Tensor]:
    """The index remap of every shard of a pruned table (see ``pruning``); empty for an unpruned package."""
    pruned = pruning.pruned_shards(manifest.pruning, manifest.placement.shards)
    if not pruned:
        return {}
    path = Path(package_dir) / pruning.REMAP_FILE
    where = str(Path(package_dir) / MANIFEST_FILE)
    return pruning.check_remaps(_load(path), path, manifest.pruning, pruned, where)


def load_dense(package_dir: str | Path) -> dict[str, Tensor]:
    """The dense part's state dict (prediction-module names)."""
    return _load(Path(package_dir) / DENSE_FILE)
