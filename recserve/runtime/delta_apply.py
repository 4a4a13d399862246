"""What ``Predictor.apply_delta`` checks and prepares before it swaps anything in (so a refused delta leaves
the predictor serving exactly what it served): the delta is the next one of this base, its rows name this
model's tables, and its dense state fits the dense part (names, shapes), converted to its dtype and device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from recserve.errors import PackageError
from recserve.runtime.delta import DENSE_FILE, ROWS_FILE, Delta
from rectrain.embedding import EmbeddingBagConfig


@dataclass(frozen=True)
class StreamPosition:
    """Which model a predictor serves: base ``base_version`` (named exactly by its manifest's sha256, when
    loaded from a package) plus its deltas ``1..sequence``; ``step``/``wall_time`` of the newest of them."""

    base_version: str
    model_name: str
    base_manifest_sha256: str = ""
    sequence: int = 0
    step: int | None = None
    wall_time: float | None = None

    @property
    def version(self) -> str:
        """``"N"`` for the base, ``"N.SEQ"`` after deltas."""
        return self.base_version if self.sequence == 0 else f"{self.base_version}.{self.sequence}"

    def after(self, delta: Delta) -> StreamPosition:
        """The position once ``delta`` is applied; PackageError unless it is the next delta of this base."""
        where = _where(delta, "manifest.json")
        if delta.base_version != self.base_version:
            raise PackageError(
                f"{where}: base_version {delta.base_version!r}, serving base {self.base_version!r}"
            )
        if self.base_manifest_sha256 and delta.base_manifest_sha256 != self.base_manifest_sha256:
            raise PackageError(
                f"{where}: base_manifest_sha256 {delta.base_manifest_sha256!r} is not the served base's "
                f"({self.base_manifest_sha256})"
            )
        if delta.model_name and delta.model_name != self.model_name:
            raise PackageError(f"{where}: model_name {delta.model_name!r}, serving {self.model_name!r}")
        if delta.starts_at != self.sequence + 1:
            raise PackageError(
                f"{where}: sequence {delta.starts_at}, expected {self.sequence + 1} (serving {self.version})"
            )
        return StreamPosition(
            self.base_version,
            self.model_name,
            self.base_manifest_sha256,
            delta.sequence,
            delta.step,
            delta.wall_time,
        )


def _where(delta: Delta, name: str) -> str:
    return str(Path(delta.path) / name) if delta.path is not None else f"delta {delta.sequence}: {name}"


def check_rows(configs: Sequence[EmbeddingBagConfig], delta: Delta) -> None:
    """PackageError unless every changed table is one of ``configs`` and its ids lie inside it (the kernels
    do not bounds-check, and ``read_delta`` is not the only way to make a Delta)."""
    where = _where(delta, ROWS_FILE)
    sizes = {c.name: c.num_embeddings for c in configs}
    for table, (ids, rows) in delta.rows.items():
        if table not in sizes:
            raise PackageError(f"{where}: table {table!r} is not one of the model's tables {sorted(sizes)}")
        if ids.dim() != 1 or rows.dim() != 2 or rows.shape[0] != ids.numel():
            raise PackageError(
                f"{where}: {table}: ids {list(ids.shape)} and rows {list(rows.shape)} do not pair"
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= sizes[table]):
            raise PackageError(f"{where}: {table}.ids: outside the table's rows [0, {sizes[table]})")


def prepare_dense(model: nn.Module, delta: Delta) -> list[tuple[Tensor, Tensor]]:
    """``(live parameter or buffer, its new value in its dtype and device)`` for the whole dense state;
    PackageError naming the file and the entry unless names and shapes are exactly the model's."""
    where = _where(delta, DENSE_FILE)
    live = {_plain_name(k): v for k, v in model.state_dict(keep_vars=True).items()}
    missing, unexpected = sorted(set(live) - set(delta.dense)), sorted(set(delta.dense) - set(live))
    if missing or unexpected:
        raise PackageError(
            f"{where}: does not fit the dense part (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    pairs = []
    for key, target in live.items():
        value = delta.dense[key]
        if value.shape != target.shape:
            raise PackageError(
                f"{where}: {key}: shape {list(value.shape)}, the model has {list(target.shape)}"
            )
        # The same conversion as loading a package does (load fp32, then ``model.to(dtype)``): exact.
        pairs.append((target, value.to(target.device, target.dtype)))
    return pairs


def copy_dense(pairs: Sequence[tuple[Tensor, Tensor]]) -> None:
    """Write the prepared values into the live tensors (which a traced graph shares)."""
    for target, value in pairs:
        target.detach().copy_(value)


def _plain_name(key: str) -> str:
    """A state-dict key without ``torch.compile``'s ``_orig_mod`` (``compile_dense`` wraps modules)."""
    return key.replace("._orig_mod.", ".").removeprefix("_orig_mod.")
