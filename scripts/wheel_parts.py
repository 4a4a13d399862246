"""Wheels too big for one trip to the GPU machine, cut into parts that each fit, and put back together there.

What one call to a lent GPU machine carries is limited (64 MiB, docs/gpu.md), and fbgemm-gpu's CUDA wheel is
about 440 MB. ``split`` rewrites each wheel larger than ``--mb`` with its files stored rather than deflated
(the same files and RECORD, so pip installs it as before), compresses that with xz, which packs CUDA machine
code much tighter than the zip's deflate, and cuts the stream into parts of at most ``--mb`` MiB, one part per
folder ``part-NN/`` so that each folder can be carried on its own. ``join`` (run by scripts/device_check.sh)
rebuilds each wheel from its parts, checks it against the sha256 recorded at split time, and puts it beside
the small wheels, ready for ``pip install --no-index --find-links``.

    python scripts/wheel_parts.py split wheels [--mb 60]   # scripts/gpu_wheels.sh runs this
    python scripts/wheel_parts.py join wheels --into /tmp/wheelhouse

Layout: ``wheels/base/`` holds the small wheels and ``parts.json`` (per split wheel: sha256, size, parts);
``wheels/part-01/``, ``part-02/``, ... one part each. Standard library only: it runs before anything is
installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

MANIFEST = "parts.json"
_CHUNK = 1 << 20


class PartsError(Exception):
    """A part is missing or a rebuilt wheel does not match what was split (the message says which)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def stored_copy(wheel: Path, out: Path) -> None:
    """``wheel`` rewritten with every member stored (same names, bytes, times and permissions)."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            copy = zipfile.ZipInfo(info.filename, info.date_time)
            copy.external_attr, copy.create_system = info.external_attr, info.create_system
            with src.open(info) as member, dst.open(copy, "w", force_zip64=True) as target:
                shutil.copyfileobj(member, target, _CHUNK)


class _PartWriter:
    """A byte stream written into ``root/part-NN/<name>.xz.NNN`` files of at most ``limit`` bytes each."""

    def __init__(self, root: Path, name: str, first: int, limit: int) -> None:
        self.root, self.name, self.number, self.limit = root, name, first, limit
        self.parts: list[str] = []
        self._file = None
        self._left = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left == 0:
                self._next()
            n = min(self._left, len(view))
            self._file.write(view[:n])
            self._left -= n
            view = view[n:]

    def _next(self) -> None:
        self.close()
        folder = self.root / f"part-{self.number:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.xz.{len(self.parts) + 1:03d}"
        self.parts.append(str(path.relative_to(self.root)))
        self._file, self._left = open(path, "wb"), self.limit  # noqa: SIM115 (closed by _next/close)
        self.number += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def split(root: Path, mb: float, preset: int = 6) -> dict:
    """Cut each wheel in ``root/base`` over ``mb`` MiB into parts; returns (and writes) the manifest."""
    base, limit = root / "base", int(mb * 2**20)
    manifest_path = base / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    used = [int(p.name.split("-")[1]) for p in root.glob("part-*") if p.name.split("-")[1].isdigit()]
    number = max(used, default=0) + 1
    for wheel in sorted(base.glob("*.whl")):
        if wheel.stat().st_size <= limit:
            continue
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            stored = Path(tmp) / wheel.name
            stored_copy(wheel, stored)
            writer = _PartWriter(root, wheel.name, number, limit)
            compressor = lzma.LZMACompressor(preset=preset)
            with open(stored, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    writer.write(compressor.compress(block))
            writer.write(compressor.flush())
            writer.close()
            manifest[wheel.name] = {
                "sha256": _sha256(stored),
                "size": stored.stat().st_size,
                "parts": writer.parts,
            }
            number = writer.number
        wheel.unlink()
        print(f"{wheel.name}: {len(writer.parts)} parts of at most {mb:g} MiB", file=sys.stderr)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _decompress(parts: list[Path], target: Path) -> None:
    decompressor = lzma.LZMADecompressor()
    with open(target, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    out.write(decompressor.decompress(block))
    if not decompressor.eof:
        raise lzma.LZMAError("the stream ends early")


def join(root: Path, into: Path) -> list[Path]:
    """Every wheel of ``root`` in ``into``: the small ones copied, the split ones rebuilt and checked."""
    base = root / "base"
    if not base.is_dir():
        raise PartsError(f"{base} is missing: carry it (made by scripts/gpu_wheels.sh)")
    into.mkdir(parents=True, exist_ok=True)
    wheels = []
    for wheel in sorted(base.glob("*.whl")):
        shutil.copy2(wheel, into / wheel.name)
        wheels.append(into / wheel.name)
    manifest_path = base / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name, entry in manifest.items():
        missing = [p for p in entry["parts"] if not (root / p).is_file()]
        if missing:
            folders = ", ".join(sorted({str(root / Path(p).parent) for p in missing}))
            count = f"{len(missing)} of {len(entry['parts'])}"
            raise PartsError(f"{name}: {count} parts missing; carry {folders}")
        target = into / name
        try:
            _decompress([root / part for part in entry["parts"]], target)
        except lzma.LZMAError as e:
            target.unlink()
            raise PartsError(f"{name}: a part is damaged (xz: {e}); carry its parts again") from None
        if _sha256(target) != entry["sha256"]:
            target.unlink()
            raise PartsError(f"{name}: a part is damaged (the rebuilt wheel's sha256 differs); carry again")
        wheels.append(target)
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split", help="cut the wheels of DIR/base larger than --mb into DIR/part-NN/")
    cut.add_argument("dir", type=Path)
    cut.add_argument("--mb", type=float, default=60.0, help="largest part in MiB (default 60)")
    cut.add_argument("--preset", type=int, default=6, help="xz preset 0-9 (default 6)")
    put = commands.add_parser("join", help="rebuild DIR's wheels into --into")
    put.add_argument("dir", type=Path)
    put.add_argument("--into", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "split":
            split(args.dir, args.mb, args.preset)
        else:
            for wheel in join(args.dir, args.into):
                print(wheel)
    except PartsError as e:
        print(f"wheel_parts: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
