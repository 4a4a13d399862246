"""The catalogue's item features and embeddings as served: read-only mappings of the package's files.

Every worker maps the same files (``MAP_PRIVATE``, never written), so the pages live once in the page cache.
The headers are checked first (``check_safetensors_file``), and the tensors' shapes against the manifest.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from recserve.errors import PackageError
from recserve.recommend.stages import StagePlan
from recserve.runtime.package import check_safetensors_file

_DTYPES = {"I64": torch.int64, "F32": torch.float32}


def map_tensors(path: Path) -> dict[str, Tensor]:
    """Every (int64 or float32) tensor of a safetensors file, as a view of the file mapped read-only."""
    stored = check_safetensors_file(path)
    size = path.stat().st_size
    flat = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    out = {}
    for name, spec in stored.items():
        if spec.dtype not in _DTYPES:
            raise PackageError(f"{path}: tensor {name!r} has dtype {spec.dtype}, expected I64 or F32")
        if spec.start % 8:
            raise PackageError(f"{path}: tensor {name!r} is not 8-byte aligned in the file")
        out[name] = flat[spec.start : spec.start + spec.nbytes].view(_DTYPES[spec.dtype]).view(spec.shape)
    return out


class ItemStore:
    """Item ids, ranking item features (jagged) and dense columns of the catalogue, by index position."""

    def __init__(self, path: Path, plan: StagePlan, rows: int) -> None:
        tensors = map_tensors(path)

        def take(name: str, dtype: torch.dtype, shape: tuple[int, ...] | None) -> Tensor:
            tensor = tensors.get(name)
            if (
                tensor is None
                or tensor.dtype != dtype
                or (shape is not None and tuple(tensor.shape) != shape)
            ):
                got = None if tensor is None else (tensor.dtype, tuple(tensor.shape))
                raise PackageError(f"{path}: tensor {name!r}: expected {dtype} {shape}, got {got}")
            return tensor

        self.item_ids = take("item_ids", torch.int64, (rows,))
        self.dense = take("dense", torch.float32, (rows, len(plan.item_dense)))
        self.features: dict[str, tuple[Tensor, Tensor]] = {}
        self.widths: dict[str, int] = {}
        for f in plan.ranking_item_features:
            offsets = take(f"{f}.offsets", torch.int64, (rows + 1,))
            values = take(f"{f}.values", torch.int64, None)
            # Offsets index the values: they must rise from 0 to the number of values (checked once here).
            if int(offsets[0]) != 0 or int(offsets[-1]) != values.numel() or bool((offsets.diff() < 0).any()):
                raise PackageError(f"{path}: tensor '{f}.offsets' does not rise from 0 to {values.numel()}")
            bound = plan.num_embeddings[f]
            if values.numel() and (int(values.min()) < 0 or int(values.max()) >= bound):
                raise PackageError(f"{path}: tensor '{f}.values' holds ids outside [0, {bound})")
            self.features[f] = (offsets, values)
            width = values.numel() // rows if rows else 0
            if width and torch.equal(offsets, torch.arange(rows + 1) * width):
                self.widths[f] = width  # every bag holds `width` ids: gathered as rows of a 2-D view
        self.rows = rows
