"""The manifest of converted data: what the columns mean, how ids were hashed, and every part file's rows,
size and sha256. ``manifest.json`` is written last and atomically, so a directory with one is complete.

    {"format": "rectrain-columnar", "format_version": 1, "kind": "criteo", "num_rows": 250000,
     "label": "click", "dense_features": ["int_0", ...], "sparse_features": ["cat_0", ...],
     "table_rows": [100000, ...], "id_dtype": "int32", "transforms": {...},
     "parts": [{"path": "part-00000.safetensors", "rows": 250000, "bytes": ..., "sha256": "..."}],
     "source": {"paths": [...], "rows_read": ..., "rows_skipped": ..., "skipped_by_column": {...}}}

Each part holds ``label`` ``[n]`` and ``dense`` ``[n, D]`` float32, ``sparse`` ``[K, n]`` (feature-major).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rectrain.datasets.columnar.part_files import DataFormatError
from rectrain.durable import sha256_file, write_text_atomic

FORMAT = "rectrain-columnar"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ID_DTYPES = ("int32", "int64")


@dataclass(frozen=True)
class PartEntry:
    """One part file (relative to the manifest's directory): its rows, size and sha256."""

    path: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class ColumnarManifest:
    """Converted data: column meanings, table sizes the ids were hashed into, and the part files in order."""

    kind: str
    label: str
    dense_features: list[str]
    sparse_features: list[str]
    table_rows: list[int]
    id_dtype: str
    parts: list[PartEntry] = field(default_factory=list)
    transforms: dict[str, str] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def num_rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def to_json(self) -> str:
        body = asdict(self)
        body.pop("format_version")
        ordered = {"format": FORMAT, "format_version": self.format_version, "num_rows": self.num_rows, **body}
        return json.dumps(ordered, indent=1) + "\n"

    def save(self, directory: Path) -> Path:
        """Write ``directory/manifest.json`` atomically (temp, fsync, rename); return its path."""
        path = Path(directory) / MANIFEST
        write_text_atomic(path, self.to_json())
        return path

    @classmethod
    def load(cls, location: str | Path) -> tuple[ColumnarManifest, Path]:
        """The manifest at ``location`` (a directory or its manifest.json) and its directory."""
        path = Path(location)
        if path.is_dir():
            path = path / MANIFEST
        if not path.is_file():
            raise DataFormatError(
                f"{path}: no manifest (not converted data, or the conversion did not finish); "
                "run `rectrain data convert`"
            )
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataFormatError(f"{path}: unreadable manifest ({e})") from None
        return cls.from_dict(raw, str(path)), path.parent

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> ColumnarManifest:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise DataFormatError(f"{where}: not a {FORMAT} manifest")
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise DataFormatError(
                f"{where}: format_version {version!r}; this rectrain reads {FORMAT_VERSION} "
                "(convert the data again with this version)"
            )
        try:
            parts = [PartEntry(**p) for p in raw["parts"]]
            manifest = cls(
                **{k: raw[k] for k in ("kind", "label", "dense_features", "sparse_features", "table_rows")},
                id_dtype=raw["id_dtype"],
                parts=parts,
                transforms=dict(raw.get("transforms", {})),
                source=dict(raw.get("source", {})),
            )
        except (KeyError, TypeError) as e:
            raise DataFormatError(f"{where}: malformed manifest ({e})") from None
        manifest.validate(where)
        if raw.get("num_rows") != manifest.num_rows:
            raise DataFormatError(f"{where}: num_rows {raw.get('num_rows')} is not the parts' sum")
        return manifest

    def validate(self, where: str) -> None:
        """``DataFormatError`` naming the field when the manifest contradicts itself."""
        if len(self.table_rows) != len(self.sparse_features):
            raise DataFormatError(
                f"{where}: table_rows has {len(self.table_rows)} entries for "
                f"{len(self.sparse_features)} sparse features"
            )
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in self.table_rows):
            raise DataFormatError(f"{where}: table_rows must be positive ints")
        if self.id_dtype not in ID_DTYPES:
            raise DataFormatError(f"{where}: id_dtype {self.id_dtype!r} is not one of {ID_DTYPES}")
        for part in self.parts:
            if not isinstance(part.rows, int) or part.rows < 0 or Path(part.path).name != part.path:
                raise DataFormatError(f"{where}: part {part.path!r} must be a file name with rows >= 0")

    def check_files(self, directory: Path, *, checksums: bool = False) -> None:
        """Every part is present, of its recorded size (and sha256 with ``checksums``); else raises."""
        for part in self.parts:
            path = directory / part.path
            if not path.is_file():
                raise DataFormatError(f"{path}: missing (the manifest lists it); convert the data again")
            size = path.stat().st_size
            if size != part.bytes:
                raise DataFormatError(f"{path}: {size} bytes, the manifest records {part.bytes} (truncated?)")
            if checksums and sha256_file(path) != part.sha256:
                raise DataFormatError(f"{path}: sha256 does not match the manifest (the file was altered)")
