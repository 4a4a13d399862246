"""The hot-row cache of a TBE over disk tables: a few slots in RAM, the rows' file behind them.

FBGEMM's TBE is built over ``slots`` rows per table instead of the table's ``rows`` (its weights and fused
optimizer state are the cache), and every batch's ids are remapped to slot numbers before the kernel sees
them, so the lookup and the fused update run on the cache in place. Per batch and table (vectorised: one
``torch.unique``, gathers and scatters, no per-id Python):

- the batch's distinct rows that are cached keep their slot (hits); the others (misses) take the free
  slots (no step in flight needs them, by a ``last_used`` step per slot) whose rows have the lowest
  **frequency score** (LFU with ageing, kept per row whether cached or not: a row's score is decayed every
  batch and raised by its ids in the batch, so hot Zipf rows stay resident, a row seen once ages out, and a
  warm row read again brings its history along instead of starting level with the tail). Victims a step
  updated are written back to the file first (whole rows: weights and optimizer state), then the misses
  are read. Planning costs the batch, not the cache: the decay is a growing scale on new counts, not a
  pass over every row, and victims are the lowest of a **window** of slots (``WINDOW`` times the misses,
  a clock hand moving through the cache) rather than of all of them: measured on 600,000 slots, a full
  ``topk`` and decay per table and batch took 42 ms, more than a step's compute;
- the rows move as **sorted batches** fanned out over a few I/O threads: a gather or scatter on the
  mapped file faults in one page per row it touches, and under a memory cap most of those are disk reads,
  which one thread would wait for one at a time; a few threads keep that many reads in flight. Nothing is
  synced per step: the files are working storage (``disk_tables``), the checkpoint is the record;
- ``prefetch`` does this for the next batch in a background thread while the current step computes: its
  rows are marked for the next step and so not evicted before it, it only evicts slots the current step
  does not use (``last_used`` below the current step), and it keeps the batch's slot numbers, so the
  step's ``remap`` of that same batch (compared whole) does no lookup of its own;
- ``flush`` writes every updated row back and empties the cache, so the files hold the whole table: it
  runs before anything reads or writes the tables as a whole (checkpoints, export, ``load_state_dict``).

The files are ``disk_tables.DiskBuffers`` (mapped; the page cache under them is reclaimable); what is exact
is that a row and its state move only as a whole, so training is bitwise the training in RAM.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from rectrain.errors import ConfigError

# Without a configured size a disk table caches this share of its rows (at least MIN_SLOTS of them).
DEFAULT_FRACTION = 0.1
MIN_SLOTS = 1024
# Every batch multiplies the rows' frequency scores by this: a row's ids count about 1 / (1 - DECAY) = 500
# batches. The rows at the edge of a Zipf cache are seen once in tens of batches, so a shorter memory cannot
# tell them from the tail: simulated on 2M rows, 600k slots and Zipf(1.05) batches of 16,384 ids, the
# distinct-row hit rate after 1,000 batches was 0.819 with 0.95 (20 batches, scores per slot) and 0.836
# with 0.998 (the static top 600k rows would give 0.874). A drift in the ids takes that long to follow.
DECAY = 0.998
# A batch's row moves (all tables together) go to about IO_THREADS threads, in pieces of at least IO_CHUNK
# rows: a row not in the page cache is a page fault that waits for the disk, one at a time per thread, so
# the threads in flight are the disk's queue. Measured on a virtual disk, 12,000 scattered rows not in the
# page cache took 2-5 s as one gather and 0.1-0.2 s as 8-32 parallel ones; a piece of cached rows is a
# memcpy that a thread hand-off would cost more than.
IO_THREADS = 16
IO_CHUNK = 32
# Victims are the lowest-scored free slots of a window of WINDOW x the misses (at least MIN_WINDOW slots):
# a hot row is evicted only when its window holds (WINDOW - 1) x the misses' worth of hotter rows.
WINDOW = 4
MIN_WINDOW = 4096
# The decay is applied as a scale on new counts (1 / DECAY more each batch); when it passes RESCALE every
# score is divided by it once (float32 holds it: the largest score stays far below its 3.4e38).
RESCALE = 1e18
_executor: ThreadPoolExecutor | None = None
_io: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _background() -> ThreadPoolExecutor:
    # One thread for every cache of the process: prefetches run in the order they were asked for.
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rectrain-disk-prefetch")
        return _executor


def _io_pool() -> ThreadPoolExecutor:
    global _io
    with _executor_lock:
        if _io is None:
            _io = ThreadPoolExecutor(max_workers=IO_THREADS, thread_name_prefix="rectrain-disk-io")
        return _io


def _run(jobs: list[Callable[[], object]]) -> None:
    """Run ``jobs`` (row moves on disjoint rows and slots) on the I/O threads and wait for all of them."""
    if len(jobs) == 1:
        jobs[0]()
        return
    for future in [_io_pool().submit(job) for job in jobs]:
        future.result()


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
class _Moves:
    """One table's row moves for a batch: ``out_rows`` written back from ``out_slots`` (sorted by row),
    then ``in_rows`` read into ``in_slots`` (sorted by row)."""

    table: CachedTable
    out_rows: Tensor
    out_slots: Tensor
    in_rows: Tensor
    in_slots: Tensor


@dataclass
class _Planned:
    """A batch's slots for one table: per id (``slots``) and distinct (``distinct``), with its counts."""

    slots: Tensor
    distinct: Tensor
    ids: int


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
        # LFU with ageing, per row whether cached or not (4 bytes a row): a row's ids count ``scale`` when
        # seen; ``scale`` grows by 1 / DECAY each batch, so older counts weigh DECAY^age as much, without a
        # pass over every row per batch. A row keeps its count while out of the cache, so a returning warm
        # row outranks a row of the Zipf tail seen once.
        self.score = torch.zeros(self.rows, dtype=torch.float32)
        self.scale = 1.0
        self.hand = 0  # where the next victim window starts
        self.filled = 0  # slots from here on have never held a row since the cache was emptied
        self.dirty = torch.zeros(self.slots, dtype=torch.bool)
        # The same maps as numpy arrays (shared memory): a batch's bookkeeping is a dozen gathers and
        # scatters of a few thousand values, where numpy's indexing costs a fifth of torch's per call.
        self._slot_of_row = self.slot_of_row.numpy()
        self._row_of_slot = self.row_of_slot.numpy()
        self._last_used = self.last_used.numpy()
        self._score = self.score.numpy()
        self._dirty = self.dirty.numpy()

    def write_back_jobs(self, rows: Tensor, slots: Tensor, piece: int) -> list[Callable[[], object]]:
        """Jobs writing ``slots`` to ``rows`` of the file (whole rows, every buffer; ``rows`` sorted), in
        pieces of about ``piece`` rows."""
        return [
            (lambda b=self.backing[name], c=cached, r=r, s=s: b.index_copy_(0, r, c.index_select(0, s)))
            for name, cached in self.cache.items()
            for r, s in _pieces(rows, slots, piece)
        ]

    def read_jobs(self, rows: Tensor, slots: Tensor, piece: int) -> list[Callable[[], object]]:
        """Jobs reading ``rows`` of the file into ``slots`` (whole rows, every buffer; ``rows`` sorted), in
        pieces of about ``piece`` rows."""
        return [
            (lambda b=self.backing[name], c=cached, r=r, s=s: c.index_copy_(0, s, b.index_select(0, r)))
            for name, cached in self.cache.items()
            for r, s in _pieces(rows, slots, piece)
        ]

    def empty(self) -> None:
        held = self.row_of_slot[self.row_of_slot >= 0]
        self.slot_of_row[held] = -1
        self.row_of_slot.fill_(-1)
        self.last_used.fill_(-1)
        self.hand = 0
        self.filled = 0
        self.dirty.fill_(False)

    def victims(self, needed: int, evictable_below: int) -> np.ndarray | None:
        """``needed`` free slots (``last_used`` below ``evictable_below``) of the lowest score: from the
        window at the clock hand where it holds enough free slots, else from all slots; None when the
        cache has too few free slots."""
        if self.filled + needed <= self.slots:  # a cache not yet full: its never-used slots first
            self.filled += needed
            return np.arange(self.filled - needed, self.filled)
        # From here on victims are chosen by score (never-used slots score 0, so they still go first); the
        # slots past ``filled`` may now be handed out here, so the in-order fill above must not run again.
        self.filled = self.slots
        last_used = self._last_used
        width = max(WINDOW * needed, MIN_WINDOW)
        if width < self.slots:
            window = np.arange(self.hand, self.hand + width) % self.slots
            self.hand = (self.hand + width) % self.slots
            candidates = np.where(last_used[window] < evictable_below, self._slot_scores(window), np.inf)
            picked = np.argpartition(candidates, needed - 1)[:needed]
            if not np.isinf(candidates[picked]).any():
                return window[picked]
        free = last_used < evictable_below
        if int(np.count_nonzero(free)) < needed:
            return None
        # Least frequent first (empty slots score 0).
        candidates = np.where(free, self._slot_scores(slice(None)), np.inf)
        return np.argpartition(candidates, needed - 1)[:needed] if needed < self.slots else np.arange(needed)

    def _slot_scores(self, slots: np.ndarray | slice) -> np.ndarray:
        """The scores of the rows ``slots`` hold (0 for a slot holding none)."""
        rows = self._row_of_slot[slots]
        return np.where(rows >= 0, self._score[np.maximum(rows, 0)], 0.0)

    def count(self, rows: np.ndarray, counts: np.ndarray) -> None:
        """Age every score by one batch and add this batch's ``counts`` of ``rows`` (distinct)."""
        self.scale /= DECAY
        if self.scale > RESCALE:
            self._score /= self.scale
            self.scale = 1.0
        self._score[rows] += counts * self.scale


def _pieces(rows: Tensor, slots: Tensor, piece: int) -> list[tuple[Tensor, Tensor]]:
    """``rows`` (sorted) and their ``slots`` in contiguous pieces of about ``piece`` rows: each piece
    touches its own stretch of the file."""
    count = -(-rows.numel() // piece)
    if count <= 1:
        return [(rows, slots)] if rows.numel() else []
    return list(zip(rows.tensor_split(count), slots.tensor_split(count)))


def _piece(counts: Sequence[int]) -> int:
    """Rows per piece for moves of ``counts`` rows (one per table): the batch's rows over IO_THREADS
    pieces, whichever tables they are in (a table's few misses would otherwise be one thread's)."""
    return max(IO_CHUNK, -(-sum(counts) // IO_THREADS))


def _move(moves: Sequence[_Moves]) -> None:
    """All tables' write-backs, then all their reads (a slot is read into only after its old row left)."""
    piece = _piece([m.out_rows.numel() for m in moves])
    _run([job for m in moves for job in m.table.write_back_jobs(m.out_rows, m.out_slots, piece)])
    piece = _piece([m.in_rows.numel() for m in moves])
    _run([job for m in moves for job in m.table.read_jobs(m.in_rows, m.in_slots, piece)])


class OutOfRange(Exception):
    """A batch holds an id outside its table (the caller names it)."""


class _TooFew(Exception):
    """A prefetch found too few free slots for a table (the step then reads its own misses)."""


@dataclass
class _Prefetched:
    """The next batch as its prefetch saw it, and its slots per table (None: the step assigns them)."""

    step: int
    indices: Tensor
    offsets: Tensor
    tables: list[_Planned | None]


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
        self._prefetched: _Prefetched | None = None
        # Per-row scratch of ``_unique`` (one plan runs at a time: a step waits for the prefetch first).
        self._scratch = np.empty(0, dtype=np.int32)

    @property
    def hit_rate(self) -> float:
        """Of the distinct rows the steps asked for, the share not read from the files (by the step or its
        prefetch)."""
        return 1.0 - self.misses / self.lookups if self.lookups else 1.0

    @property
    def full(self) -> bool:
        """Every table's cache has handed out all its slots (its misses now evict rows)."""
        return all(table.filled == table.slots for table in self.tables)

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
        ready, self._prefetched = self._prefetched, None
        if not (
            ready is not None
            and ready.step == self.step
            and torch.equal(ready.indices, indices)
            and torch.equal(ready.offsets, offsets)
        ):
            ready = None
        out, moves = [], []
        for i, (table, ids) in enumerate(zip(self.tables, self._segments(indices, offsets))):
            planned = ready.tables[i] if ready is not None else None
            if planned is None:  # not prefetched (or too few free slots then): the step reads its misses
                planned, move = self._plan(table, ids, self.step, self.step, strict=True)
                if move is not None:
                    moves.append(move)
            self.lookups += planned.distinct.numel()
            self.id_lookups += planned.ids
            if train:
                table.dirty[planned.distinct] = True
            out.append(planned.slots.to(indices.dtype))
        if moves:
            _move(moves)
        return torch.cat(out) if len(out) > 1 else out[0]

    def prefetch(self, indices: Tensor, offsets: Tensor) -> None:
        """Read the next batch's missing rows in the background (the next ``remap`` waits for it)."""
        self.wait()
        # Copies: the step compares what it is given with what was prefetched, whatever the caller does
        # with its tensors meanwhile.
        indices, offsets = indices.clone(), offsets.clone()
        self._pending = _background().submit(self._prefetch, indices, offsets, self.step)

    def _prefetch(self, indices: Tensor, offsets: Tensor, current: int) -> None:
        planned: list[_Planned | None] = []
        moves = []
        for table, ids in zip(self.tables, self._segments(indices, offsets)):
            try:
                plan, move = self._plan(table, ids, current + 1, current, strict=False)
            except (OutOfRange, _TooFew):  # the step itself names a bad id or reads its own misses
                planned.append(None)
                continue
            planned.append(plan)
            if move is not None:
                moves.append(move)
        _move(moves)
        self._prefetched = _Prefetched(current + 1, indices, offsets, planned)

    def wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def flush(self) -> None:
        """Write every updated row back and empty the cache: the files then hold the whole tables, and
        whatever is written into them before the next batch is what that batch reads."""
        self.wait()
        self._prefetched = None
        moves = []
        for table in self.tables:
            held = ((table.row_of_slot >= 0) & table.dirty).nonzero().flatten()
            rows, order = table.row_of_slot[held].sort()
            self.writes += held.numel()
            empty = rows[:0]
            moves.append(_Moves(table, rows, held[order], empty, empty))
        _move(moves)
        for table in self.tables:
            table.empty()

    def _plan(
        self, table: CachedTable, ids: Tensor, use: int, evictable_below: int, strict: bool
    ) -> tuple[_Planned, _Moves | None]:
        """Slots of ``ids`` and the row moves that put them there: the missing rows take the free slots
        (``last_used`` below ``evictable_below``) of the lowest score. The maps are updated now (the
        caller moves the rows before any lookup reads them); the batch's slots are marked used at step
        ``use``. Raises ``_TooFew`` when there are too few free slots and ``strict`` is False (a prefetch),
        a ConfigError naming the table when ``strict``."""
        if ids.numel() == 0:
            empty = ids.to(torch.int64)
            return _Planned(empty, empty, 0), None
        batch = ids.numpy()
        if int(batch.min()) < 0 or int(batch.max()) >= table.rows:
            raise OutOfRange
        distinct, inverse, counts = self._unique(batch, table.rows)
        slots = table._slot_of_row[distinct].astype(np.int64)
        miss = np.flatnonzero(slots < 0)
        table._last_used[slots[slots >= 0]] = use  # this batch's hits are not victims of its own misses
        move = None
        if miss.size:
            miss = miss[np.argsort(distinct[miss])]  # the rows to read in file order
            wanted = distinct[miss]
            slots_in = table.victims(wanted.size, evictable_below)
            if slots_in is None:
                if not strict:
                    raise _TooFew
                held = int(np.count_nonzero(table._last_used >= evictable_below))
                raise ConfigError(
                    f"table {table.name!r}: a batch reads {distinct.size} distinct rows but its disk cache "
                    f"has {table.slots} slots ({held} held for this and the next step); "
                    "raise train.disk_cache_mb or the table's planned cache"
                )
            evicted = table._row_of_slot[slots_in]
            held = evicted >= 0
            out = np.flatnonzero(held & table._dirty[slots_in])
            out = out[np.argsort(evicted[out])]
            self.writes += out.size
            table._slot_of_row[evicted[held]] = -1
            table._slot_of_row[wanted] = slots_in
            table._row_of_slot[slots_in] = wanted
            table._dirty[slots_in] = False
            slots[miss] = slots_in
            self.misses += wanted.size
            if strict:
                self.id_misses += int(counts[miss].sum())
            move = _Moves(
                table,
                torch.from_numpy(evicted[out]),
                torch.from_numpy(slots_in[out]),
                torch.from_numpy(wanted),
                torch.from_numpy(slots_in),
            )
        table._last_used[slots] = use
        table.count(distinct, counts)
        return _Planned(torch.from_numpy(slots[inverse]), torch.from_numpy(slots), ids.numel()), move

    def _unique(self, ids: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The distinct values of ``ids`` (in no particular order), each id's index among them, and their
        counts; without a sort: every id writes its position to a per-row scratch array, and an id is its
        row's representative where it reads its own position back. Which of a row's positions is kept is
        numpy's choice; exactly one is, and every id of the row reads that one."""
        if self._scratch.size < rows:
            self._scratch = np.empty(max(rows, max(t.rows for t in self.tables)), dtype=np.int32)
        positions = np.arange(ids.size, dtype=np.int32)
        self._scratch[ids] = positions
        last = self._scratch[ids]
        representative = last == positions
        index = np.cumsum(representative) - 1
        inverse = index[last]
        distinct = ids[representative].astype(np.int64)
        return distinct, inverse, np.bincount(inverse, minlength=distinct.size)
