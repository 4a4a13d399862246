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

import dataclasses
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
from recserve.runtime.stitched import BackingFile, Stitched, backing_file
from recserve.runtime.stitched import available as stitched_available

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
    base: Tensor  # the kernel's base rows (one buffer)
    offsets: tuple[int, ...]  # per table: its row 0 in ``base``, in bytes
    num_rows: tuple[int, ...]  # per table
    widths: tuple[int, ...]  # per table: bytes of a padded kernel row

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
            base=base,
            offsets=tuple(offsets),
            num_rows=tuple(rows for _, rows, _, _, _ in tbe.embedding_specs),
            widths=tuple(widths),
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
    def empty(cls, layout: KernelLayout) -> RowOverlay | StitchedOverlay:
        """No changed rows yet: a :class:`StitchedOverlay` where the kernel's rows are a file mapping on
        Linux (read in place), else a compact-table overlay."""
        stitched = StitchedOverlay.empty(layout)
        if stitched is not None:
            return stitched
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

    def activate(self) -> None:
        """Nothing to do: a compact overlay is served as it is."""

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


_SLACK_ROWS = 4096  # a log may hold this many superseded rows beyond its live ones before it is compacted


@dataclass
class _Log:
    """A kernel's stitched range, how many log slots of each table are written, and the row map the served
    version reads (shared by the versions built on this range; only the thread that builds versions
    writes slots, and only ``activate`` writes the map, between batches)."""

    stitched: Stitched
    used: list[int]
    remap: Tensor  # per table with changed rows: stitched row of each base row (itself, or its log row)
    remap_offsets: Tensor  # int64 [T + 1]: each table's part of ``remap`` (empty: not changed, ids pass)


@dataclass(frozen=True)
class StitchedOverlay:
    """The changed rows of one kernel, read in place: they sit in the log of a :class:`Stitched` range
    behind each table's base rows, so a batch only remaps its ids (FBGEMM's ``pruned_array_lookup``, built
    for pruned tables: one array read per id in C++, 4 bytes a row of each changed table) and runs the
    kernel's own op over the range. Bags sum the same bytes in the same order as over a full export.

    ``merged`` writes the new rows to fresh log slots (older versions' slots stay as they were) and leaves
    the row map's update ``pending`` until ``activate`` (between batches: a scatter of the delta's rows);
    when a table is changed for the first time it builds a new map, and when the log is full or mostly
    superseded rows a new range with only the live rows and its map (older versions keep theirs)."""

    layout: KernelLayout
    log: _Log
    pending: tuple[Tensor, Tensor] | None  # (positions in the map, new stitched rows) for ``activate``
    feature_offsets: Tensor  # int64 [F]: each feature's table start in the stitched buffer
    wide: bool  # stitched row numbers may pass int32: ids are looked up as int64
    num_rows: int  # changed rows (live: the newest bytes of each)

    @classmethod
    def empty(cls, layout: KernelLayout) -> StitchedOverlay | None:
        """None where the kernel's rows are not one mapped file on the CPU (then overlays are compact)."""
        if not stitched_available() or layout.base.device.type != "cpu" or any(w <= 0 for w in layout.widths):
            return None
        source = backing_file(layout.base)
        if source is None:
            return None
        try:
            stitched = _stitch(layout, source)
        except OSError:
            return None
        return cls._on(layout, stitched, [0] * len(layout.widths), {}, 0)

    @classmethod
    def _on(
        cls, layout: KernelLayout, stitched: Stitched, used: list[int], maps: Mapping[int, Tensor], live: int
    ) -> StitchedOverlay:
        """A version on ``stitched`` (slots ``used``) with its own row map made of ``maps`` (table -> its
        whole map): older versions keep theirs."""
        last_row = max(f + c for f, c in zip(stitched.first_slot, stitched.capacity))
        wide = last_row >= 2**31 - 1
        dtype = torch.int64 if wide else torch.int32
        sizes = [layout.num_rows[t] if t in maps else 0 for t in range(len(layout.widths))]
        remap = torch.cat([maps[t].to(dtype) for t in sorted(maps)]) if maps else torch.empty(0, dtype=dtype)
        log = _Log(stitched, used, remap, torch.tensor([0, *sizes], dtype=torch.int64).cumsum(0))
        starts = torch.tensor(stitched.starts, dtype=torch.int64)
        return cls(layout, log, None, starts[layout.feature_tables.cpu()], wide, live)

    def _map_of(self, table: int) -> Tensor | None:
        """``table``'s part of the row map (a view), or None when it has no changed rows."""
        a, b = self.log.remap_offsets[table : table + 2].tolist()
        return self.log.remap[a:b] if b > a else None

    @property
    def nbytes(self) -> int:
        """This worker's memory for changed rows: the log's written rows (superseded ones included, until
        the log is compacted) and the row map."""
        log = sum(u * w for u, w in zip(self.log.used, self.log.stitched.widths))
        return log + self.log.remap.numel() * self.log.remap.element_size()

    def merged(self, changes: Mapping[int, tuple[Tensor, Tensor]], where: str) -> StitchedOverlay:
        """This overlay with ``changes`` (kernel table -> (sorted local row ids, kernel rows)) on top; a new
        version, prepared beside serving (``activate`` makes its row map the served one). PackageError
        naming ``where`` on rows of the wrong width. Bulk work goes through torch functions, which release
        the GIL (``index_select``/``index_copy_``, not ``[]`` indexing, which holds it): serving threads run
        Python meanwhile."""
        layout, log = self.layout, self.log
        new = {}
        for t, (ids, rows) in changes.items():
            if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != layout.row_bytes[t]:
                raise PackageError(
                    f"{where}: table {t}: rows must be uint8 [n, {layout.row_bytes[t]}], got {rows.dtype} "
                    f"{tuple(rows.shape)}"
                )
            new[t] = (ids.long().cpu(), rows.cpu())
        fresh = 0  # rows changed for the first time since the base (an unchanged row maps to itself)
        for t, (ids, _) in new.items():
            table_map = self._map_of(t)
            fresh += (
                ids.numel()
                if table_map is None
                else int((table_map.index_select(0, ids).long() == ids).sum())
            )
        adding = sum(ids.numel() for ids, _ in new.values())
        fits = all(log.used[t] + ids.numel() <= log.stitched.capacity[t] for t, (ids, _) in new.items())
        if not fits or sum(log.used) + adding > 2 * (self.num_rows + fresh) + _SLACK_ROWS:
            return self._compacted(new)
        stitched_rows = {}
        for t, (ids, rows) in new.items():  # fresh slots: no version reads them yet
            first, n = log.used[t], ids.numel()
            log.stitched.slots(t, first, n)[:, : rows.shape[1]].copy_(rows)
            log.used[t] += n
            stitched_rows[t] = torch.arange(first, first + n, dtype=torch.int64) + log.stitched.first_slot[t]
        if any(self._map_of(t) is None for t in new):  # a table's first change: a new map, built here
            maps = {t: m.clone() for t in range(len(layout.widths)) if (m := self._map_of(t)) is not None}
            for t, (ids, _) in new.items():
                maps.setdefault(t, torch.arange(layout.num_rows[t], dtype=log.remap.dtype))
                maps[t].index_copy_(0, ids, stitched_rows[t].to(maps[t].dtype))
            return self._on(layout, log.stitched, log.used, maps, self.num_rows + fresh)
        positions = torch.cat([ids + int(log.remap_offsets[t]) for t, (ids, _) in new.items()])
        values = torch.cat(list(stitched_rows.values())).to(log.remap.dtype)
        return dataclasses.replace(self, pending=(positions, values), num_rows=self.num_rows + fresh)

    def activate(self) -> None:
        """Make this version's row map the served one: the scatter of its new rows into the shared map,
        between batches (``use_overlays``); idempotent."""
        if self.pending is not None:
            self.log.remap.index_copy_(0, *self.pending)

    def _compacted(self, new: Mapping[int, tuple[Tensor, Tensor]]) -> StitchedOverlay:
        """The live rows (``new`` over the current ones) copied into a new range with a new row map: the
        old range is unmapped with the last version that reads it."""
        layout, old = self.layout, self.log.stitched
        source = backing_file(layout.base)
        if source is None:
            raise PackageError("the base package's table file is gone; cannot apply more deltas to it")
        stitched = _stitch(layout, source)
        used, maps = [0] * len(layout.widths), {}
        for t in range(len(layout.widths)):
            table_map = self._map_of(t)
            if table_map is None and t not in new:
                continue
            base_rows = torch.arange(layout.num_rows[t], dtype=torch.int64)
            table_map = base_rows if table_map is None else table_map.long()
            kept = (table_map != base_rows).nonzero().squeeze(1)
            ids, rows = [kept], [old.rows(t, table_map[kept])]
            if t in new:
                ids[0] = kept[~torch.isin(kept, new[t][0])]
                rows[0] = old.rows(t, table_map[ids[0]])
                ids.append(new[t][0])
                rows.append(torch.nn.functional.pad(new[t][1], (0, old.widths[t] - new[t][1].shape[1])))
            live = torch.cat(ids)
            stitched.slots(t, 0, live.numel()).copy_(torch.cat(rows))
            used[t] = live.numel()
            base_rows[live] = torch.arange(live.numel(), dtype=torch.int64) + stitched.first_slot[t]
            maps[t] = base_rows
        return self._on(layout, stitched, used, maps, sum(used))

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
        if self.wide and indices.dtype != torch.int64:
            indices, offsets = indices.long(), offsets.long()
        features = self.layout.feature_tables.numel()
        bounds = offsets[:: (offsets.numel() - 1) // features]  # where each feature's ids start, and the end
        table_starts = bounds[list(self.layout.first_feature)]
        log = self.log
        rows = torch.ops.fbgemm.pruned_array_lookup(indices, table_starts, log.remap, log.remap_offsets)
        return _run(tbe, log.stitched.buffer, self.feature_offsets, rows, offsets, per_sample_weights)


_LOG_ROWS_PER_ROW = 2  # a table's log holds twice its rows (address space only; untouched pages cost nothing)


def _stitch(layout: KernelLayout, source: BackingFile) -> Stitched:
    """A new range for ``layout``'s tables, each with a log of ``_LOG_ROWS_PER_ROW`` times its rows: a
    compacted log (at most one row per base row) always fits, and deltas append for a long while before
    the next compaction (whose cost is the live rows, on the preparing thread)."""
    rows = list(layout.num_rows)
    capacity = [_LOG_ROWS_PER_ROW * n for n in rows]
    return Stitched.build(source, list(layout.offsets), rows, list(layout.widths), capacity)


def _newest(keys: list[Tensor], values: list[Tensor]) -> tuple[Tensor, Tensor]:
    """The union of ``keys`` (each unique), sorted, with the value of the last list holding each key."""
    all_keys, all_values = torch.cat(keys), torch.cat(values)
    order = torch.argsort(all_keys, stable=True)
    sorted_keys = all_keys[order]
    last = torch.ones_like(sorted_keys, dtype=torch.bool)
    last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
    return sorted_keys[last], all_values[order[last]]


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
