"""Generates the Python gRPC stubs (``*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py``) from ``protos/``.

One build step, three callers: setup.py's ``build_py`` hook (wheels and editable installs),
``scripts/venv.sh`` (``python -m recserve.server.protogen``), and :func:`ensure_generated` on first import in
a source checkout whose stubs are missing or older than their .proto. Generated files are git-ignored and
never edited by hand.

``protos/recserve/v1/predictor.proto`` becomes the package ``recserve.v1`` and
``protos/recserve/oip/grpc_predict_v2.proto`` the package ``recserve.oip``. This module imports nothing from
recserve so that setup.py can load it by path before the project is installed.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "protos"


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every .proto under ``proto_root`` that belongs to a Python package (``recserve/...``)."""
    return sorted((proto_root / "recserve").rglob("*.proto"))


def _outputs(proto: Path, proto_root: Path, out_root: Path) -> list[Path]:
    rel = proto.relative_to(proto_root).with_suffix("")
    base = out_root / rel.parent
    return [base / f"{rel.name}{suffix}" for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]


def is_stale(proto_root: Path = PROTO_ROOT, out_root: Path = REPO_ROOT) -> bool:
    """True when a stub is missing or older than the .proto it comes from."""
    for proto in proto_files(proto_root):
        for out in _outputs(proto, proto_root, out_root):
            if not out.exists() or out.stat().st_mtime < proto.stat().st_mtime:
                return True
    return False


def generate(proto_root: Path = PROTO_ROOT, out_root: Path = REPO_ROOT) -> list[Path]:
    """Runs grpc_tools.protoc over every .proto; writes stubs (and packages' ``__init__.py``) to ``out_root``.

    Files are generated in a temp dir and moved into place with ``os.replace``, so a concurrent importer
    (several server workers starting at once) sees either the old or the new file, never half of one.
    """
    from grpc_tools import protoc  # build-time dependency, imported only when generating

    protos = proto_files(proto_root)
    if not protos:
        raise FileNotFoundError(f"no .proto files under {proto_root / 'recserve'}")
    include = Path(protoc.__file__).parent / "_proto"
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="recserve-protogen-") as tmp:
        args = ["grpc_tools.protoc", f"-I{proto_root}", f"-I{include}"]
        args += [f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}"]
        rc = protoc.main(args + [str(p) for p in protos])
        if rc != 0:
            raise RuntimeError(f"grpc_tools.protoc exited with {rc} for {[str(p) for p in protos]}")
        for proto in protos:
            for out in _outputs(proto, proto_root, out_root):
                src = Path(tmp) / out.relative_to(out_root)
                out.parent.mkdir(parents=True, exist_ok=True)
                staged = out.with_name(f".{out.name}.{os.getpid()}.tmp")
                shutil.copyfile(src, staged)
                os.replace(staged, out)
                written.append(out)
            init = out.parent / "__init__.py"
            if not init.exists():
                init.write_text('"""Generated from protos/ by recserve.server.protogen; do not edit."""\n')
                written.append(init)
    logger.info("generated %d stub files from %d protos", len(written), len(protos))
    return written


def ensure_generated() -> None:
    """In a source checkout, (re)generates stale stubs; in an installed package, does nothing."""
    if PROTO_ROOT.is_dir() and is_stale():
        generate()


def main(argv: list[str] | None = None) -> int:
    """``python -m recserve.server.protogen [--check]``: generate, or exit 1 when the stubs are stale."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        return 1 if is_stale() else 0
    for path in generate():
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
