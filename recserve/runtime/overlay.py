"""Changed rows over one FBGEMM int-N kernel's read-only base rows, looked up exactly as a full export would.

The base rows are the package files mapped ``MAP_PRIVATE`` and shared by every worker: they are never written
or copied whole. The rows that deltas changed since the base live here (per worker; the union, newest bytes
win), keyed ``table << 40 | row`` and grouped by the kernel's row width.

Exactness: FBGEMM's CPU kernel sums a bag's rows in order, so a bag cannot be split into a base part and an
overlay part without changing the float rounding. Instead, per batch, ``lookup`` builds a compact table of
exactly the rows the batch reads, one row per id occurrence in the kernel's own input order (base rows
gathered from the mapping, changed rows from the overlay), points each feature at its part of it, and runs the
same FBGEMM op with the kernel's own dtypes, dims, pooling and output type. Every bag then sums the same
bytes in the same order as a kernel over a full export. Nothing in the kernel is mutated (the op is called
with the compact buffer), so concurrent predicts stay safe and no kernel is ever rebuilt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
    IntNBitTableBatchedEmbeddingBagsCodegen,
    rounded_row_size_in_bytes,
    unpadded_row_size_in_bytes,
)
from torch import Tensor

from recserve.errors import PackageError

_SHIFT = 40  # key = table << 40 | row: tables of up to 2^40 rows
_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


@dataclass(frozen=True)
class _Group:
    """The kernel's tables whose rows are ``width`` bytes, gathered in words of ``word`` bytes (the largest
    that divides the width, every table's offset and the buffer's address: a uint8 gather is ~3x slower)."""

    width: int
    word: int
    window: Tensor  # the base buffer as overlapping rows of width / word words, one starting at every word

    @property
    def words(self) -> int:
        return self.width // self.word


@dataclass(frozen=True)
class _Run:
    """Consecutive tables ``[first, end)`` of one group: their ids are one slice of the kernel's input."""

    group: int
    first: int
    end: int


@dataclass(frozen=True)
class KernelLayout:
    """Where one kernel's tables lie in its base buffer, and how its features map onto them."""

    groups: tuple[_Group, ...]
    group_of: tuple[int, ...]  # per table
    row_bytes: tuple[int, ...]  # per table: bytes of a stored (unpadded) kernel row
    word_offsets: Tensor  # int64 [T]: each table's row 0 in its group's words
    feature_tables: Tensor  # int64 [F], non-decreasing (features are grouped by table)
    first_feature: tuple[int, ...]  # per table, plus F at the end
    runs: tuple[_Run, ...]

    @classmethod
    def of(cls, tbe: IntNBitTableBatchedEmbeddingBagsCodegen) -> KernelLayout:
        base = tbe.weights_host if tbe.host_size > 0 else tbe.weights_dev
        tables = tbe.feature_table_map
        assert tables == sorted(tables), "a kernel's features are grouped by table, in table order"
        specs: list[tuple[int, SparseType]] = [(dim, ty) for _, _, dim, ty, _ in tbe.embedding_specs]
        widths = [
            rounded_row_size_in_bytes(d, ty, tbe.row_alignment, tbe.scale_bias_size_in_bytes)
            for d, ty in specs
        ]
        offsets = list(tbe.weights_physical_offsets)
        groups: list[_Group] = []
        group_of = []
        for width in widths:
            if width not in [g.width for g in groups]:
                members = [offsets[t] for t, w in enumerate(widths) if w == width]
                groups.append(_group(base, width, members))
            group_of.append([g.width for g in groups].index(width))
        runs: list[_Run] = []
        for t, g in enumerate(group_of):
            if runs and runs[-1].group == g:
                runs[-1] = _Run(g, runs[-1].first, t + 1)
            else:
                runs.append(_Run(g, t, t + 1))
        first = [tables.index(t) for t in range(len(widths))] + [len(tables)]
        device = base.device
        return cls(
            groups=tuple(groups),
            group_of=tuple(group_of),
            row_bytes=tuple(
                unpadded_row_size_in_bytes(d, ty, tbe.scale_bias_size_in_bytes) for d, ty in specs
            ),
            word_offsets=torch.tensor(
                [o // groups[g].word for o, g in zip(offsets, group_of)], dtype=torch.int64, device=device
            ),
            feature_tables=torch.tensor(tables, dtype=torch.int64, device=device),
            first_feature=tuple(first),
            runs=tuple(runs),
        )


def _group(base: Tensor, width: int, offsets: list[int]) -> _Group:
    word = next(
        w for w in _WORDS if width % w == 0 and base.data_ptr() % w == 0 and all(o % w == 0 for o in offsets)
    )
    flat = base[: base.numel() - base.numel() % word].view(_WORDS[word])
    words = width // word
    window = flat.as_strided((max(flat.numel() - words + 1, 0), words), (1, 1))
    return _Group(width, word, window)


@dataclass(frozen=True)
class RowOverlay:
    """The changed rows of one kernel (per width group: sorted keys and their rows in the group's words)."""

    layout: KernelLayout
    keys: tuple[Tensor, ...]
    rows: tuple[Tensor, ...]

    @classmethod
    def empty(cls, layout: KernelLayout) -> RowOverlay:
        device = layout.word_offsets.device
        return cls(
            layout,
            tuple(torch.empty(0, dtype=torch.int64, device=device) for _ in layout.groups),
            tuple(torch.empty(0, g.words, dtype=_WORDS[g.word], device=device) for g in layout.groups),
        )

    @property
    def num_rows(self) -> int:
        return sum(k.numel() for k in self.keys)

    @property
    def nbytes(self) -> int:
        return sum(
            k.numel() * k.element_size() + r.numel() * r.element_size() for k, r in zip(self.keys, self.rows)
        )

    def merged(self, changes: Mapping[int, tuple[Tensor, Tensor]], where: str) -> RowOverlay:
        """This overlay with ``changes`` (kernel table -> (sorted local row ids, kernel rows)) on top; a new
        overlay, this one unchanged. PackageError naming ``where`` on rows of the wrong width."""
        layout = self.layout
        keys, rows = list(self.keys), list(self.rows)
        for g, group in enumerate(layout.groups):
            tables = sorted(t for t in changes if layout.group_of[t] == g)
            if not tables:
                continue
            new_keys = [(changes[t][0].long() | (t << _SHIFT)) for t in tables]
            new_rows = [
                _padded(changes[t][1], layout.row_bytes[t], group, f"{where}: table {t}") for t in tables
            ]
            all_keys = torch.cat([keys[g], *new_keys])
            all_rows = torch.cat([rows[g], *new_rows])
            # Stable: of equal keys the newest (appended last) comes last, and the last of each run is kept.
            order = torch.argsort(all_keys, stable=True)
            sorted_keys = all_keys[order]
            last = torch.ones_like(sorted_keys, dtype=torch.bool)
            last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
            keys[g] = sorted_keys[last]
            rows[g] = all_rows[order[last]]
        return RowOverlay(layout, tuple(keys), tuple(rows))

    def lookup(
        self,
        tbe: IntNBitTableBatchedEmbeddingBagsCodegen,
        indices: Tensor,
        offsets: Tensor,
        per_sample_weights: Tensor | None,
    ) -> Tensor:
        """``tbe(indices, offsets, per_sample_weights)`` with the overlay's rows in place of the base's."""
        if indices.numel() == 0 or self.num_rows == 0:
            return tbe(indices, offsets, per_sample_weights)
        buffer, local, weights_offsets = self._compact(indices, offsets)
        return _run(tbe, buffer, weights_offsets, local, offsets, per_sample_weights)

    def _compact(self, indices: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(compact rows, ids into them, each feature's byte offset)``: one row per id occurrence, in input
        order, so each table's rows are one slice (features are grouped by table) and an id's new value is
        its position in that slice."""
        layout = self.layout
        n, num_features = indices.numel(), layout.feature_tables.numel()
        bounds_t = offsets[:: (offsets.numel() - 1) // num_features]
        bounds = bounds_t.tolist()  # where each feature's ids start, and the end
        table_of = layout.feature_tables.repeat_interleave(bounds_t.diff().long(), output_size=n)
        ids = indices.long()
        start = [bounds[f] for f in layout.first_feature]  # where each table's ids start
        pieces, byte_start, position = [], [0] * len(start[:-1]), 0
        for run in layout.runs:
            group = layout.groups[run.group]
            a, b = start[run.first], start[run.end]
            for t in range(run.first, run.end):
                byte_start[t] = position + (start[t] - a) * group.width
            if a == b:
                continue
            tables, rows_of = table_of[a:b], ids[a:b]
            rows = group.window.index_select(0, layout.word_offsets[tables] + rows_of * group.words)
            self._replace_changed(run.group, rows, (tables << _SHIFT) | rows_of)
            pieces.append(rows.view(torch.uint8).reshape(-1))
            position += (b - a) * group.width
        buffer = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        table_start = torch.tensor(start[:-1], dtype=torch.int64, device=ids.device)
        local = torch.arange(n, device=ids.device) - table_start[table_of]
        feature_offsets = torch.tensor(byte_start, dtype=torch.int64, device=ids.device)[
            layout.feature_tables
        ]
        return buffer, local.to(indices.dtype), feature_offsets

    def _replace_changed(self, group: int, rows: Tensor, keys: Tensor) -> None:
        changed = self.keys[group]
        if changed.numel() == 0:
            return
        at = torch.searchsorted(changed, keys).clamp_(max=changed.numel() - 1)
        hit = (changed[at] == keys).nonzero().squeeze(1)
        rows.index_copy_(0, hit, self.rows[group].index_select(0, at[hit]))


def _padded(rows: Tensor, row_bytes: int, group: _Group, where: str) -> Tensor:
    """Kernel rows ``[n, row_bytes]`` uint8 as the group's rows: padded to its width, in its words."""
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != row_bytes:
        raise PackageError(
            f"{where}: rows must be uint8 [n, {row_bytes}], got {rows.dtype} {tuple(rows.shape)}"
        )
    if group.width > row_bytes:
        rows = torch.nn.functional.pad(rows, (0, group.width - row_bytes))
    return rows.contiguous().view(_WORDS[group.word])


def _run(
    tbe: IntNBitTableBatchedEmbeddingBagsCodegen,
    buffer: Tensor,
    weights_offsets: Tensor,
    indices: Tensor,
    offsets: Tensor,
    per_sample_weights: Tensor | None,
) -> Tensor:
    """The kernel's own FBGEMM op (what its forward calls) over ``buffer`` instead of its base rows."""
    return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
        dev_weights=buffer,
        uvm_weights=tbe.weights_uvm,
        weights_placements=tbe.weights_placements,
        weights_offsets=weights_offsets,
        weights_tys=tbe.weights_tys,
        D_offsets=tbe.D_offsets,
        total_D=tbe.total_D,
        max_int2_D=tbe.max_int2_D,
        max_int4_D=tbe.max_int4_D,
        max_int8_D=tbe.max_int8_D,
        max_float16_D=tbe.max_float16_D,
        max_float32_D=tbe.max_float32_D,
        indices=indices,
        offsets=offsets,
        pooling_mode=int(tbe.pooling_mode),
        indice_weights=per_sample_weights,
        output_dtype=tbe.output_dtype,
        lxu_cache_weights=tbe.lxu_cache_weights,
        lxu_cache_locations=torch.empty(0, dtype=torch.int32, device=buffer.device),
        row_alignment=tbe.row_alignment,
        max_float8_D=tbe.max_float8_D,
        fp8_exponent_bits=tbe.fp8_exponent_bits,
        fp8_exponent_bias=tbe.fp8_exponent_bias,
    )
