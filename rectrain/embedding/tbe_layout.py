"""Where a table-batched embedding (TBE) keeps each table and feature, and per-table row gradients.

Shared by the CPU backward paths (the compiled kernel, its torch-ops fallback and the fused Adam), which all
address a TBE's flat weight and optimizer-state buffers table by table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

from rectrain.errors import ConfigError


@dataclass(frozen=True)
class TBELayout:
    """Where each table lives in a TBE's flat weight buffer and each feature in its output.

    ``weights_offsets[t]`` is the start of table ``t`` (one per *table*; FBGEMM's ``weights_offsets``
    buffer is the per-*feature* expansion, see :attr:`feature_weights_offsets`). Table ``t`` occupies
    ``table_rows[t] * table_dims[t]`` consecutive values, row-major. Feature ``f`` reads table
    ``feature_table_map[f]``; features are laid out in order in the pooled output (:attr:`D_offsets`).
    """

    table_rows: tuple[int, ...]
    table_dims: tuple[int, ...]
    weights_offsets: tuple[int, ...]
    feature_table_map: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("table_rows", "table_dims", "weights_offsets", "feature_table_map"):
            object.__setattr__(self, name, tuple(int(v) for v in getattr(self, name)))
        num_tables = len(self.table_rows)
        if num_tables == 0:
            raise ConfigError("TBELayout needs at least one table; table_rows is empty")
        if len(self.table_dims) != num_tables or len(self.weights_offsets) != num_tables:
            raise ConfigError(
                f"table_rows, table_dims and weights_offsets must have one entry per table; got lengths "
                f"{num_tables}, {len(self.table_dims)}, {len(self.weights_offsets)}"
            )
        for t, (rows, dim, start) in enumerate(zip(self.table_rows, self.table_dims, self.weights_offsets)):
            if rows <= 0 or dim <= 0 or start < 0:
                raise ConfigError(
                    f"table {t}: rows ({rows}) and dim ({dim}) must be > 0 and weights offset ({start}) >= 0"
                )
        bad = [t for t in self.feature_table_map if not 0 <= t < num_tables]
        if bad:
            raise ConfigError(f"feature_table_map names tables {bad}, but there are only {num_tables} tables")
        spans = sorted((start, start + rows * dim, t) for t, (rows, dim, start) in enumerate(self._tables()))
        for (_, end, t), (next_start, _, u) in zip(spans, spans[1:]):
            if next_start < end:
                raise ConfigError(f"tables {t} and {u} overlap in the weight buffer ({t} ends at {end})")

    @classmethod
    def from_tables(
        cls,
        table_rows: Sequence[int],
        table_dims: Sequence[int],
        feature_table_map: Sequence[int] | None = None,
    ) -> TBELayout:
        """Tables packed back to back in order (FBGEMM's host layout); one feature per table by default."""
        starts = [0]
        for rows, dim in zip(table_rows, table_dims):
            starts.append(starts[-1] + rows * dim)
        if feature_table_map is None:
            feature_table_map = range(len(table_rows))
        return cls(
            tuple(table_rows), tuple(table_dims), tuple(starts[: len(table_rows)]), tuple(feature_table_map)
        )

    def _tables(self) -> zip[tuple[int, int, int]]:
        return zip(self.table_rows, self.table_dims, self.weights_offsets)

    @property
    def num_tables(self) -> int:
        return len(self.table_rows)

    @property
    def num_features(self) -> int:
        return len(self.feature_table_map)

    @property
    def num_weights(self) -> int:
        """The smallest flat buffer length that holds every table."""
        return max(start + rows * dim for rows, dim, start in self._tables())

    @property
    def feature_dims(self) -> tuple[int, ...]:
        return tuple(self.table_dims[t] for t in self.feature_table_map)

    @property
    def D_offsets(self) -> tuple[int, ...]:  # noqa: N802 - FBGEMM's name
        """Column where each feature's block starts in the pooled output, plus the total width."""
        offsets = [0]
        for dim in self.feature_dims:
            offsets.append(offsets[-1] + dim)
        return tuple(offsets)

    @property
    def feature_weights_offsets(self) -> tuple[int, ...]:
        """FBGEMM's per-feature ``weights_offsets`` buffer: the start of each feature's table."""
        return tuple(self.weights_offsets[t] for t in self.feature_table_map)

    def table_view(self, buffer: Tensor, table: int) -> Tensor:
        """Table ``table`` of a flat buffer (weights or optimizer state) as a ``[rows, dim]`` view."""
        rows, dim, start = self.table_rows[table], self.table_dims[table], self.weights_offsets[table]
        return buffer[start : start + rows * dim].view(rows, dim)


class TableRowGrads(NamedTuple):
    """The rows of one table a batch read (local ids, sorted, unique) and their summed gradients."""

    rows: Tensor  # int64 [n]
    grads: Tensor  # [n, table_dim]
