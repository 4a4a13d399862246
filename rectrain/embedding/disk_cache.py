"""The hot-row cache of a TBE over disk tables: a few slots in RAM, the rows' file behind them.

FBGEMM's TBE is built over ``slots`` rows per table instead of the table's ``rows`` (its weights and fused
optimizer state are the cache), and every batch's ids are remapped to slot numbers before the kernel sees
them, so the lookup and the fused update run on the cache in place. Per batch and table (vectorised: one
``torch.unique``, gathers and scatters, no per-id Python):

- the batch's distinct rows that are cached keep their slot (hits); each of the others (misses) takes the
  least recently used slot no step in flight needs (LRU at step granularity, by a ``last_used`` step per
  slot), whose row is written back to the file first when a step updated it (whole rows: weights and
  optimizer state, ``index_copy_`` into the mapped file), and is then read from the file;
- ``prefetch`` does this for the next batch in a background thread while the current step computes: its
  rows are marked for the next step and so not evicted before it, and it only evicts slots the current step
  does not use (``last_used`` below the current step), so the two never touch the same slot;
- ``flush`` writes every updated row back and empties the cache, so the files hold the whole table: it
  runs before anything reads or writes the tables as a whole (checkpoints, export, ``load_state_dict``).

The files are ``disk_tables.DiskBuffers`` (mapped; the page cache under them is reclaimable); what is exact
is that a row and its state move only as a whole, so training is bitwise the training in RAM.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rectrain.errors import ConfigError

_NEVER = torch.iinfo(torch.int64).max
# Without a configured size a disk table caches this share of its rows (at least MIN_SLOTS of them).
DEFAULT_FRACTION = 0.1
MIN_SLOTS = 1024
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _background() -> ThreadPoolExecutor:
    # One thread for every cache of the process: prefetches run in the order they were asked for.
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rectrain-disk-prefetch")
        return _executor


def cache_slots(
    rows: Sequence[int],
    row_bytes: Sequence[int],
    names: Sequence[str],
    kernel_bytes: int | None,
    table_bytes: dict[str, int] | None = None,
) -> list[int]:
    """Slots per table: ``table_bytes[name]`` (the planner's cache of that table) where given, else the
    kernel's ``kernel_bytes`` shared in proportion to the tables' rows, else ``DEFAULT_FRACTION`` of the
    rows; never more than the rows, never fewer than one."""
    total_rows = max(1, sum(rows))
    slots = []
    for n, width, name in zip(rows, row_bytes, names):
        if table_bytes and name in table_bytes:
            want = table_bytes[name] // width
        elif kernel_bytes is not None:
            want = int(kernel_bytes * n / total_rows) // width
        else:
            want = max(MIN_SLOTS, int(n * DEFAULT_FRACTION))
        slots.append(max(1, min(n, want)))
    return slots


@dataclass
class CachedTable:
    """One table's cache: ``cache[buffer]`` is ``[slots, width]`` inside the TBE, ``backing[buffer]`` the
    ``[rows, width]`` file view; the maps say which row each slot holds and back."""

    name: str
    cache: dict[str, Tensor]
    backing: dict[str, Tensor]
    rows: int = field(init=False)
    slots: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = next(iter(self.backing.values())).shape[0]
        self.slots = next(iter(self.cache.values())).shape[0]
        # int32 per row: 4 bytes against a row's hundreds; -1 = not cached.
        self.slot_of_row = torch.full((self.rows,), -1, dtype=torch.int32)
        self.row_of_slot = torch.full((self.slots,), -1, dtype=torch.int64)
        self.last_used = torch.full((self.slots,), -1, dtype=torch.int64)
        self.dirty = torch.zeros(self.slots, dtype=torch.bool)

    def write_back(self, slots: Tensor) -> None:
        """Write the rows of ``slots`` that a step updated back to the file (whole rows, every buffer)."""
        rows = self.row_of_slot[slots]
        keep = (rows >= 0) & self.dirty[slots]
        if not bool(keep.any()):
            return
        slots, rows = slots[keep], rows[keep]
        for name, cached in self.cache.items():
            self.backing[name].index_copy_(0, rows, cached.index_select(0, slots))
        self.dirty[slots] = False

    def empty(self) -> None:
        held = self.row_of_slot[self.row_of_slot >= 0]
        self.slot_of_row[held] = -1
        self.row_of_slot.fill_(-1)
        self.last_used.fill_(-1)
        self.dirty.fill_(False)


class OutOfRange(Exception):
    """A batch holds an id outside its table (the caller names it)."""


class RowCache:
    """The caches of one TBE's tables, fed by its batches (``remap``) and the next batch (``prefetch``).

    Args:
        tables: one ``CachedTable`` per table of the TBE, in TBE order.
        features_per_table: how many of the TBE's features read each table (features are in table order).
    """

    def __init__(self, tables: Sequence[CachedTable], features_per_table: Sequence[int]) -> None:
        self.tables = list(tables)
        self._features = list(features_per_table)
        self.step = 0
        self.lookups = 0  # distinct rows asked for, summed over steps
        self.misses = 0  # rows read from the files (by a step or a prefetch)
        self.id_lookups = 0  # ids looked up (a row once per occurrence)
        self.id_misses = 0  # of those, the ids whose row a step had to read itself
        self.writes = 0  # rows written back
        self._pending: Future | None = None

    @property
    def hit_rate(self) -> float:
        """Of the distinct rows the steps asked for, the share not read from the files (by the step or its
        prefetch)."""
        return 1.0 - self.misses / self.lookups if self.lookups else 1.0

    @property
    def id_hit_rate(self) -> float:
        """Of the ids looked up, the share whose row was in the cache when its step began (prefetched rows
        count as hits: they were read while the step before computed)."""
        return 1.0 - self.id_misses / self.id_lookups if self.id_lookups else 1.0

    def _segments(self, indices: Tensor, offsets: Tensor) -> list[Tensor]:
        """Each table's ids: its features are contiguous in ``indices`` (FBGEMM's feature-major layout)."""
        features = sum(self._features)
        batch = (offsets.numel() - 1) // features
        bounds = offsets[::batch].tolist() if batch else [0] * (features + 1)
        out, first = [], 0
        for count in self._features:
            out.append(indices[bounds[first] : bounds[first + count]])
            first += count
        return out

    def remap(self, indices: Tensor, offsets: Tensor, train: bool) -> Tensor:
        """``indices`` as slot numbers, every row of the batch in the cache; raises ``OutOfRange``."""
        self.wait()
        self.step += 1
        out = []
        for table, ids in zip(self.tables, self._segments(indices, offsets)):
            slots = self._assign(table, ids, self.step, self.step, strict=True)
            assert slots is not None
            if train:
                table.dirty[slots] = True
            out.append(slots.to(indices.dtype))
        return torch.cat(out) if len(out) > 1 else out[0]

    def prefetch(self, indices: Tensor, offsets: Tensor) -> None:
        """Read the next batch's missing rows in the background (the next ``remap`` waits for it)."""
        self.wait()
        self._pending = _background().submit(self._prefetch, indices, offsets, self.step)

    def _prefetch(self, indices: Tensor, offsets: Tensor, current: int) -> None:
        for table, ids in zip(self.tables, self._segments(indices, offsets)):
            with contextlib.suppress(OutOfRange):  # the step itself names the bad id
                self._assign(table, ids, current + 1, current, strict=False)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def flush(self) -> None:
        """Write every updated row back and empty the cache: the files then hold the whole tables, and
        whatever is written into them before the next batch is what that batch reads."""
        self.wait()
        for table in self.tables:
            held = (table.row_of_slot >= 0).nonzero().flatten()
            self.writes += int((table.dirty[held]).sum())
            table.write_back(held)
            table.empty()

    def _assign(
        self, table: CachedTable, ids: Tensor, use: int, evictable_below: int, strict: bool
    ) -> Tensor | None:
        """Slots of ``ids`` (per id), reading the missing rows into slots whose ``last_used`` is below
        ``evictable_below``; marks the batch's slots used at step ``use``. None when the cache has too few
        free slots and ``strict`` is False (a prefetch: the step then reads them itself)."""
        if ids.numel() == 0:
            return ids.to(torch.int64)
        uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        if int(uniq[0]) < 0 or int(uniq[-1]) >= table.rows:
            raise OutOfRange
        slots = table.slot_of_row[uniq].to(torch.int64)
        miss = slots < 0
        wanted = uniq[miss]
        table.last_used[slots[~miss]] = use  # this batch's hits are not victims of its own misses
        if strict:
            self.lookups += uniq.numel()
            self.id_lookups += ids.numel()
            self.id_misses += int(counts[miss].sum())
        if wanted.numel():
            free = table.last_used < evictable_below
            available = int(free.sum())
            if available < wanted.numel():
                if not strict:
                    return None
                raise ConfigError(
                    f"table {table.name!r}: a batch reads {uniq.numel()} distinct rows but its disk cache "
                    f"has {table.slots} slots ({table.slots - available} held for this and the next step); "
                    "raise train.disk_cache_mb or the table's planned cache"
                )
            victims = torch.topk(torch.where(free, table.last_used, _NEVER), wanted.numel(), largest=False)
            slots_in = victims.indices
            self.writes += int((table.dirty[slots_in] & (table.row_of_slot[slots_in] >= 0)).sum())
            table.write_back(slots_in)
            evicted = table.row_of_slot[slots_in]
            table.slot_of_row[evicted[evicted >= 0]] = -1
            for name, cached in table.cache.items():
                cached.index_copy_(0, slots_in, table.backing[name].index_select(0, wanted))
            table.slot_of_row[wanted] = slots_in.to(torch.int32)
            table.row_of_slot[slots_in] = wanted
            table.dirty[slots_in] = False
            slots[miss] = slots_in
            self.misses += wanted.numel()
        table.last_used[slots] = use
        return slots[inverse]
