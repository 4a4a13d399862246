"""Generates the Python gRPC stubs (``*_pb2.py``, ``*_pb2.pyi``, ``*_pb2_grpc.py``) from ``protos/``.

One build step, three callers: setup.py's ``build_py`` hook (wheels and editable installs),
``scripts/venv.sh`` (``python -m recserve.server.transports.protogen``), and :func:`ensure_generated` on first
import in a source checkout whose stubs are missing or older than their .proto. Generated files are
git-ignored and never edited by hand.

``protos/recserve/v1/predictor.proto`` becomes the package ``recserve.v1`` and
``protos/recserve/oip/grpc_predict_v2.proto`` the package ``recserve.oip``. This module imports nothing from
recserve so that setup.py can load it by path before the project is installed.

Two things protoc does not do for us:

- A .proto whose package is not ours (``package inference;``, the Open Inference Protocol) registers its
  descriptors in a private descriptor pool instead of protobuf's default one. tritonclient and KServe
  register their own ``inference.*`` messages in the default pool, and two files defining one symbol there
  fail to import ("duplicate symbol"). The wire is unaffected: a method path and field numbers are all a
  peer sees.
- Stubs stamp the protobuf and grpcio versions they were generated for, and refuse to import on an older or
  other-major runtime. Building in an isolated environment (newest grpcio-tools) and then installing beside
  ``tritonclient`` (protobuf < 7) gives such a pair, so stubs the installed runtime cannot import count as
  stale and are regenerated with the grpcio-tools installed beside that runtime.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
PROTO_ROOT = REPO_ROOT / "protos"


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every .proto under ``proto_root`` that belongs to a Python package (``recserve/...``)."""
    return sorted((proto_root / "recserve").rglob("*.proto"))


def _outputs(proto: Path, proto_root: Path, out_root: Path) -> list[Path]:
    rel = proto.relative_to(proto_root).with_suffix("")
    base = out_root / rel.parent
    return [base / f"{rel.name}{suffix}" for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]


_OWN_PACKAGE = "recserve."
_PROTOBUF_STAMP = re.compile(r"^# Protobuf Python Version: (\S+)$", re.M)
_GRPC_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '([^']+)'$", re.M)
_DEFAULT_POOL_ADD = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL_ADD = "DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile("


def proto_package(proto: Path) -> str:
    """The ``package`` a .proto declares ("" when none)."""
    match = re.search(r"^package\s+([\w.]+)\s*;", proto.read_text(), re.M)
    return match.group(1) if match else ""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def runtime_accepts(stub_text: str, protobuf_version: str, grpc_version: str) -> bool:
    """Whether runtimes of these versions import a stub with this text (protobuf's and grpcio's own rules:
    protobuf needs the same major and at least the generator's version, grpcio at least the generator's)."""
    pb = _PROTOBUF_STAMP.search(stub_text)
    if pb is not None:
        made, runtime = _version(pb.group(1)), _version(protobuf_version)
        if made[:1] != runtime[:1] or made > runtime:
            return False
    gr = _GRPC_STAMP.search(stub_text)
    return gr is None or _version(gr.group(1)) <= _version(grpc_version)


def _installed_versions() -> tuple[str, str] | None:
    try:
        import grpc
        from google import protobuf
    except ImportError:  # building before the runtime is installed: the mtimes decide
        return None
    return protobuf.__version__, grpc.__version__


def is_stale(proto_root: Path = PROTO_ROOT, out_root: Path = REPO_ROOT) -> bool:
    """True when a stub is missing, older than its .proto, or made for a protobuf/grpcio this runtime refuses
    (a stub made by another grpcio-tools than the installed one)."""
    versions = _installed_versions()
    for proto in proto_files(proto_root):
        for out in _outputs(proto, proto_root, out_root):
            if not out.exists() or out.stat().st_mtime < proto.stat().st_mtime:
                return True
            if (
                versions is not None
                and out.suffix == ".py"
                and not runtime_accepts(out.read_text(), *versions)
            ):
                return True
    return False


def _private_pool(stub: Path) -> None:
    """Makes a generated ``_pb2.py`` register its file in a pool of its own (see the module docstring)."""
    text = stub.read_text()
    if _DEFAULT_POOL_ADD not in text:
        raise RuntimeError(f"{stub}: protoc output changed; cannot find {_DEFAULT_POOL_ADD!r}")
    stub.write_text(text.replace(_DEFAULT_POOL_ADD, _PRIVATE_POOL_ADD, 1))


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
            if not proto_package(proto).startswith(_OWN_PACKAGE):
                _private_pool(Path(tmp) / _outputs(proto, proto_root, out_root)[0].relative_to(out_root))
            for out in _outputs(proto, proto_root, out_root):
                src = Path(tmp) / out.relative_to(out_root)
                out.parent.mkdir(parents=True, exist_ok=True)
                staged = out.with_name(f".{out.name}.{os.getpid()}.tmp")
                shutil.copyfile(src, staged)
                os.replace(staged, out)
                written.append(out)
            init = out.parent / "__init__.py"
            if not init.exists():
                init.write_text('"""Generated by recserve.server.transports.protogen; do not edit."""\n')
                written.append(init)
    logger.info("generated %d stub files from %d protos", len(written), len(protos))
    return written


def ensure_generated() -> None:
    """In a source checkout, (re)generates stale stubs; in an installed package, does nothing."""
    if PROTO_ROOT.is_dir() and is_stale():
        generate()


def main(argv: list[str] | None = None) -> int:
    """``python -m recserve.server.transports.protogen [--check]``: generate, or exit 1 if stubs are stale."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        return 1 if is_stale() else 0
    for path in generate():
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
