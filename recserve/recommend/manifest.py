"""The pipeline package on disk (see docs/recommend.md):

    <pipeline>/manifest.json            stages, user schema, catalogue, index; sha256 of every file below
    <pipeline>/retrieval/               the two-tower package (an ordinary model package)
    <pipeline>/ranking/                 the ranking package (an ordinary model package)
    <pipeline>/items.safetensors        item_ids [M], per ranking item feature offsets [M+1] / values, dense
    <pipeline>/embeddings.safetensors   the candidate tower's embeddings [M, L] float32
    <pipeline>/index.faiss              the ANN index over them (faiss's own format, positions 0..M-1)

Each stage package is pinned by the sha256 of its ``manifest.json`` (which lists the sha256 of each of its
files) and verified as a package when loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recserve.errors import PackageError
from recserve.recommend.stages import StagePlan
from recserve.runtime.package import MANIFEST_FILE, read_manifest, verify_files, verify_listed_files
from rectrain.durable import sha256_file

FORMAT_NAME = "recserve-pipeline-package"
FORMAT_VERSION = 1
STAGE_DIRS = ("retrieval", "ranking")
ITEMS_FILE = "items.safetensors"
EMBEDDINGS_FILE = "embeddings.safetensors"
INDEX_FILE = "index.faiss"


@dataclass
class Limits:
    """Request bounds: candidates retrieved (default, max), ``k`` returned (default, max), excluded ids."""

    num_candidates: int = 1000
    max_candidates: int = 4000
    top_k: int = 100
    max_k: int = 1000
    max_exclude: int = 1000


@dataclass
class PipelineManifest:
    model_name: str
    version: str
    plan: StagePlan
    limits: Limits
    catalogue: dict[str, Any]
    index: dict[str, Any]
    stages: dict[str, dict[str, Any]]
    files: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "model_name": self.model_name,
            "version": self.version,
            "stages": self.stages,
            "plan": self.plan.to_dict(),
            "limits": dict(self.limits.__dict__),
            "catalogue": self.catalogue,
            "index": self.index,
            "files": self.files,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> PipelineManifest:
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise PackageError(f"{where}: not a recserve pipeline manifest (no 'format': {FORMAT_NAME!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise PackageError(
                f"{where}: format_version {data.get('format_version')!r} is not {FORMAT_VERSION}"
            )
        try:
            return cls(
                model_name=str(data["model_name"]),
                version=str(data["version"]),
                plan=StagePlan.from_dict(dict(data["plan"])),
                limits=Limits(**dict(data["limits"])),
                catalogue=dict(data["catalogue"]),
                index=dict(data["index"]),
                stages={str(k): dict(v) for k, v in data["stages"].items()},
                files={str(k): dict(v) for k, v in data["files"].items()},
            )
        except KeyError as error:
            raise PackageError(f"{where}: missing key {error.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as error:
            raise PackageError(f"{where}: malformed manifest ({error})") from None


def is_pipeline(directory: str | Path) -> bool:
    """Whether ``directory`` holds a pipeline package (its manifest names the pipeline format)."""
    try:
        return json.loads((Path(directory) / MANIFEST_FILE).read_text()).get("format") == FORMAT_NAME
    except (OSError, ValueError, AttributeError, RecursionError):
        return False  # not a readable pipeline manifest: the package loader names the problem


def read_pipeline(directory: str | Path, *, verify: bool = True) -> PipelineManifest:
    """The pipeline's manifest; with ``verify``, every file and both stage packages checked (PackageError)."""
    path = Path(directory) / MANIFEST_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PackageError(f"{path}: cannot be read as JSON ({error})") from None
    except RecursionError:  # json.loads recurses once per nested array or object
        raise PackageError(f"{path}: nested too deeply to be a pipeline manifest") from None
    manifest = PipelineManifest.from_dict(data, str(path))
    if verify:
        verify_listed_files(directory, manifest.files, folders=STAGE_DIRS)
        for stage in STAGE_DIRS:
            stage_dir = Path(directory) / stage
            recorded = manifest.stages.get(stage, {}).get("manifest_sha256")
            got = sha256_file(stage_dir / MANIFEST_FILE) if (stage_dir / MANIFEST_FILE).is_file() else None
            if got is None or got != recorded:
                raise PackageError(
                    f"{stage_dir / MANIFEST_FILE}: sha256 {got} does not match {path} stages.{stage} "
                    f"({recorded}); the stage package is missing or was changed after export"
                )
            verify_files(stage_dir, read_manifest(stage_dir))
    return manifest
