"""Build hook: generate the gRPC stubs from protos/ before the Python files are collected.

Everything else about the project lives in pyproject.toml. The generator is loaded by path, so building
does not import recserve (or torch); see recserve/server/transports/protogen.py.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
GENERATED_PACKAGES = ["recserve.v1", "recserve.oip"]


def _protogen():
    spec = importlib.util.spec_from_file_location(
        "_recserve_protogen", ROOT / "recserve" / "server" / "transports" / "protogen.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProtos(build_py):
    """``build_py`` that first runs grpc_tools.protoc, then ships the generated packages too."""

    def run(self):
        _protogen().generate()
        self.packages = sorted(set(self.packages or []) | set(GENERATED_PACKAGES))
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
