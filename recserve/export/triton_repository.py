"""``recserve export --triton-repository DIR``: a Triton model repository that serves a recserve package.

Layout (Triton's): ``DIR/<model>/config.pbtxt`` and ``DIR/<model>/<version>/{model.py, package/}``, the
package copied whole (its manifest's checksums are verified when the backend loads it). The model runs on
Triton's Python backend (:mod:`recserve.export.triton_backend`, the batch function ``recserve serve`` runs)
behind Triton's dynamic batcher. Requests carry a leading dimension of 1: the batcher groups requests (up to
``max_requests_per_batch``), and every input allows ragged batching, since requests differ in examples and
ids (without it Triton refuses them: "batch size does not match other inputs"). The backend's interpreter
must import recserve and torch: start ``tritonserver`` with them on ``PYTHONPATH``, which ``model.py``
adds to the stub's ``sys.path`` (the stub's embedded interpreter ignores the variable itself).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from recserve.errors import ExportError
from recserve.runtime.package import read_manifest

_MODEL_PY = '''"""Triton Python backend for the recserve package in ./package (written by recserve export)."""

import os
import sys

# The backend's stub embeds an interpreter that ignores PYTHONPATH: honour it here, so that recserve, torch
# and their dependencies import from where tritonserver's environment says.
for entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    if entry and entry not in sys.path:
        sys.path.insert(0, entry)

from recserve.export.triton_backend import TritonPythonModel  # noqa: E402,F401
'''


@dataclass(frozen=True)
class TritonOptions:
    """What the repository's ``config.pbtxt`` sets: Triton's dynamic batcher and instances, and the
    backend's torch threads per instance."""

    max_requests_per_batch: int = 8
    max_queue_delay_us: int = 2000
    instances: int = 1
    torch_threads: int = 1
    max_examples_per_request: int = 512

    def __post_init__(self) -> None:
        for name in ("max_requests_per_batch", "instances", "torch_threads", "max_examples_per_request"):
            if getattr(self, name) < 1:
                raise ExportError(f"triton repository: {name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue_delay_us < 0:
            raise ExportError(
                f"triton repository: max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}"
            )


def config_pbtxt(package_dir: str | Path, options: TritonOptions = TritonOptions()) -> str:
    """The model configuration of ``package_dir``'s model, in Triton's text format."""
    manifest = read_manifest(package_dir)
    width = manifest.dense_in_features
    weighted = set(manifest.weighted_features)
    inputs = [_input("dense", "TYPE_FP32", [-1, width])]
    for f in manifest.feature_names:
        inputs += [_input(f"{f}.lengths", "TYPE_INT32", [-1]), _input(f"{f}.values", "TYPE_INT64", [-1])]
        if f in weighted:
            inputs.append(_input(f"{f}.weights", "TYPE_FP32", [-1], optional=True))
    parameters = {
        "torch_threads": options.torch_threads,
        "max_examples_per_request": options.max_examples_per_request,
    }
    params = ",\n".join(f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items())
    return (
        f'name: "{manifest.model_name}"\n'
        'backend: "python"\n'
        f"max_batch_size: {options.max_requests_per_batch}\n"
        "input [\n" + ",\n".join(inputs) + "\n]\n"
        'output [\n  { name: "scores" data_type: TYPE_FP32 dims: [ -1 ] }\n]\n'
        f"dynamic_batching {{ max_queue_delay_microseconds: {options.max_queue_delay_us} }}\n"
        f"instance_group [\n  {{ count: {options.instances} kind: KIND_CPU }}\n]\n"
        "parameters [\n" + params + "\n]\n"
    )


def _input(name: str, dtype: str, dims: list[int], *, optional: bool = False) -> str:
    extra = " optional: true" if optional else ""
    dims_text = ", ".join(map(str, dims))
    return f'  {{ name: "{name}" data_type: {dtype} dims: [ {dims_text} ] allow_ragged_batch: true{extra} }}'


def write_triton_repository(
    package_dir: str | Path, repository: str | Path, options: TritonOptions = TritonOptions()
) -> Path:
    """Writes ``repository/<model>/`` serving ``package_dir`` (replacing that model's version directory);
    returns the model directory. The package's version must be a number (Triton's version directories)."""
    package_dir = Path(package_dir)
    manifest = read_manifest(package_dir)
    version = manifest.version
    if not version.isdigit() or version.startswith("0"):
        raise ExportError(
            f"--triton-repository: package version {version!r} is not a Triton version (a number without "
            "leading zeros); export with --version N"
        )
    model_dir = Path(repository) / manifest.model_name
    version_dir = model_dir / version
    if version_dir.exists():
        shutil.rmtree(version_dir)
    version_dir.mkdir(parents=True)
    shutil.copytree(package_dir, version_dir / "package")
    (version_dir / "model.py").write_text(_MODEL_PY)
    (model_dir / "config.pbtxt").write_text(config_pbtxt(package_dir, options))
    return model_dir
