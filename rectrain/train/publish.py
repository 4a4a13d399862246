"""Delta publishing: the trainer writes what a following server (``recserve serve --follow DIR``) applies.

At every ``publish.every_seconds`` (rank 0's clock; the ranks agree at a step boundary) the rows that the
trained batches read since the last publish (``TouchedRows``, per rank) are united over the ranks; each rank
quantizes the whole rows of those it holds, as the export quantizes them, and hands them to rank 0 in one
tensor gather (pieces of column-sharded rows go as fp32; rank 0 joins and quantizes those), and rank 0 writes
them with the dense state as the next delta of the newest base (``recserve.export.delta``), on a background
thread. A data-parallel table is published whole: its dense optimizer may move rows no batch read.

A base is cut at the start of a run and every ``publish.base_every`` deltas: the ranks save a checkpoint (the
run's own) and rank 0 exports it into ``DIR/<N>`` on a background thread of low priority, streamed from that
checkpoint as ``recserve export`` does. Until the export completes the deltas continue on the previous base,
while the rows changed since the cut accumulate; they become the new base's first delta. When a base
completes, those older than the one before it are retired. A run always starts a new base (its state may be
older than deltas an earlier attempt published past its last checkpoint); staging left by a killed run is
removed first.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from recserve.export.delta import write_delta
from recserve.export.exporter import export_checkpoint
from recserve.export.quantize import quantize_kernel_rows
from recserve.export.sources import CheckpointSource
from rectrain.checkpoint import model_state
from rectrain.distributed import ShardingEnv
from rectrain.distributed.comm.timeouts import collective, new_group
from rectrain.errors import ConfigError
from rectrain.priority import lower_thread_priority
from rectrain.train.config import RunConfig
from rectrain.train.sync import RankAgreement
from rectrain.train.touched import TouchedRows

logger = logging.getLogger(__name__)

_BASE = re.compile(r"^(\d+)(-deltas)?$")
# Flags rank 0 decides and every rank acts on at the same step.
_DUE, _BASE_DONE, _BASE_FAILED, _DELTA_FAILED = 1, 2, 4, 8


def _joined(tensors: list[Tensor]) -> Tensor:
    """The tensors end to end; one (a table held by one rank) as it is, without a copy."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


@dataclass
class _BaseExport:
    version: str
    step: int
    future: Future


def existing_bases(publish_dir: Path) -> list[int]:
    """The base numbers with a folder (complete or its deltas) in ``publish_dir``."""
    if not publish_dir.is_dir():
        return []
    return sorted({int(m.group(1)) for p in publish_dir.iterdir() if (m := _BASE.match(p.name))})


class Publisher:
    """This rank's part of publishing (every method is collective: all ranks call it at the same step)."""

    def __init__(
        self, config: RunConfig, model: torch.nn.Module, env: ShardingEnv | None, agreement: RankAgreement
    ) -> None:
        self.config, self.options = config, config.publish
        self.dir = Path(self.options.dir or "")
        self.rank = env.rank if env is not None else 0
        world = env.world_size if env is not None and env.pg is not None else 1
        self._group = new_group(backend="gloo") if world > 1 else None
        self._agreement = agreement  # the job's: one side group for every per-step agreement
        self.tables = list(config.model.tables)
        self.touched = TouchedRows(self.tables)
        pieces = {t.name: t for t in model_state.local_tables(model).values()}
        missing = [t.name for t in self.tables if t.name not in pieces]
        if missing:
            raise ConfigError(f"{config.source}: publish: the model holds no table named {missing}")
        self._pieces = [pieces[t.name] for t in self.tables]
        # Tables whose changed rows this rank copies (``_local_rows``): its own shards of a sharded table.
        self._holds_rows = [
            bool(t.pieces) and not (t.replicated and t.sharding_type != model_state.UNSHARDED)
            for t in self._pieces
        ]
        self._model, self._prefix = model, model_state.prediction_prefix(model)
        self._base: str | None = None
        self._sequence = 0
        self._pending: _BaseExport | None = None
        self._since_cut: list[Tensor] | None = None
        self._writer = ThreadPoolExecutor(1, "delta-writer") if self.rank == 0 else None
        self._last_write: Future | None = None
        self._publishes_since_cut = 0
        self._delta_failed = False
        self._last_time = time.monotonic()
        self._published_step: int | None = None
        self._first_step = 0

    def observe(self, stream: Iterator[Any]) -> Iterator[Any]:
        """The training batches, their rows tracked."""
        return self.touched.observe(stream)

    def start(self, step: int, cut: Callable[[], None]) -> None:
        """Tidy the publish dir, cut the run's first base at ``step`` (``cut`` saves a checkpoint there)."""
        if self.rank == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            for leftover in self.dir.glob(".*"):
                shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink()
        self._first_step = step  # the stream's first batch trains step + 1, one batch a step
        self._cut(step, cut)
        self._last_time = time.monotonic()

    def after_step(self, step: int, cut: Callable[[], None]) -> None:
        """Publish when the period is over (or a base export has ended, so that its delta follows at once)."""
        flags = 0
        if self.rank == 0:
            due = time.monotonic() - self._last_time >= self.options.every_seconds
            flags = self._flags(due, wait=False)
        flags = self._agreement.most(flags)
        if flags & (_DUE | _BASE_DONE | _BASE_FAILED | _DELTA_FAILED):
            self._publish(step, flags, cut)

    def finish(self, step: int, cut: Callable[[], None], *, wait_for_base: bool = True) -> None:
        """The run's last delta; ``wait_for_base`` first lets a base export in progress complete (not on
        SIGTERM: the grace period is short). Waits for the writes to land."""
        flags = self._flags(True, wait=wait_for_base) if self.rank == 0 else 0
        flags = self._agreement.most(flags)
        if step != self._published_step or flags & ~_DUE:
            self._publish(step, flags, cut, final=True)
        if self._last_write is not None:
            self._last_write.result()
        if self._writer is not None:
            self._writer.shutdown()

    def wait_for_export(self) -> None:
        """Let a running base export finish reading its checkpoint (before a save may retire that one)."""
        if self._pending is not None and self.rank == 0:
            self._pending.future.exception()  # waits; a failure is reported at the next publish

    def _flags(self, due: bool, wait: bool) -> int:
        flags = _DUE if due else 0
        if self._pending is not None and (wait or self._pending.future.done()):
            failed = self._pending.future.exception() is not None
            flags |= _BASE_FAILED if failed else _BASE_DONE
        if self._last_write is not None and self._last_write.done():
            self._check_last_write()
        return flags | (_DELTA_FAILED if self._delta_failed else 0)

    def _publish(self, step: int, flags: int, cut: Callable[[], None], final: bool = False) -> None:
        self._last_time = time.monotonic()
        wall_time = time.time()
        changed = self._union(self.touched.take(trained=step - self._first_step))
        if self._since_cut is not None:
            for marks, ids in zip(self._since_cut, changed):
                marks[ids] = True
        if flags & _BASE_DONE:
            self._switch_base()
            changed = [marks.nonzero().squeeze(1) for marks in self._since_cut or []]
            self._since_cut = None
        elif flags & _BASE_FAILED:
            self._report_failed_export()
        cut_now = bool(flags & _DELTA_FAILED)
        if cut_now:  # the stream has a hole: only a new base continues it
            self._base, self._delta_failed = None, False
        if self._base is not None:
            self._write(step, changed, wall_time)
        self._published_step = step
        self._publishes_since_cut += 1
        due = (
            cut_now or self._publishes_since_cut >= self.options.base_every
        )  # a failed export: at the cadence
        if self._pending is None and due and not final:
            self._cut(step, cut)

    def _cut(self, step: int, cut: Callable[[], None]) -> None:
        """Save a checkpoint at ``step`` (all ranks) and export it as the next base (rank 0, background)."""
        cut()
        self._since_cut = [torch.zeros(t.num_embeddings, dtype=torch.bool) for t in self.tables]
        number = (max(existing_bases(self.dir), default=0) + 1) if self.rank == 0 else 0
        version = str(self._agreement.most(number))
        future: Future = Future()
        if self.rank == 0:
            _in_background(future, f"base-export-{version}", self._export_base, version, step)
        self._pending = _BaseExport(version, step, future)
        self._publishes_since_cut = 0

    def _export_base(self, version: str, step: int) -> Path:
        options, root = self.options, self.config.checkpoint.dir or ""
        with CheckpointSource(root, step=step) as checkpoint:
            source = {"checkpoint": str(Path(root).resolve()), "step": step}
            return export_checkpoint(
                self.dir / version,
                self.config.model,
                checkpoint,
                dtype=options.dtype,
                dense_dtype=options.dense_dtype,
                model_name=options.model_name,
                version=version,
                source={**source, "world_size": checkpoint.manifest.world_size},
                max_auc_drop=options.max_auc_drop,
                dense_range=checkpoint.manifest.extra.get("dense_range"),
            )

    def _switch_base(self) -> None:
        assert self._pending is not None
        self._base = self._pending.version
        logger.info("publish: base %s (step %d) is complete", self._base, self._pending.step)
        self._sequence, self._pending = 0, None
        if self.rank == 0:  # keep this base and the one before it (a follower may still be on it)
            older = [n for n in existing_bases(self.dir) if n < int(self._base)]
            for number in older[:-1]:
                shutil.rmtree(self.dir / f"{number}-deltas", ignore_errors=True)
                shutil.rmtree(self.dir / str(number), ignore_errors=True)

    def _check_last_write(self) -> None:
        """Wait for the last delta's write; a failure is logged once and leaves a hole in the stream, which
        the next publish closes with a new base (raising it would stop training, and again at every later
        delta)."""
        assert self._last_write is not None
        error, self._last_write = self._last_write.exception(), None
        if error is not None:
            logger.error("publish: a delta was not written (a new base follows): %s", error)
            self._delta_failed = True

    def _report_failed_export(self) -> None:
        assert self._pending is not None
        if self.rank == 0:
            error = self._pending.future.exception()
            logger.error("publish: base %s was not written: %s", self._pending.version, error)
        self._pending = self._since_cut = None  # the next publish cuts again

    def _union(self, local: list[Tensor]) -> list[Tensor]:
        """Every rank's ids of each table, united (sorted); collective."""
        if self._group is None:
            return local
        counts = torch.tensor([ids.numel() for ids in local], dtype=torch.int64)
        gathered_counts = [torch.empty_like(counts) for _ in range(dist.get_world_size(self._group))]
        with collective("all_gather (publish counts)", self._group):
            dist.all_gather(gathered_counts, counts, group=self._group)
        longest = max(int(c.sum()) for c in gathered_counts)
        flat = torch.cat([*local, torch.full((longest - int(counts.sum()),), -1, dtype=torch.int64)])
        gathered = [torch.empty(longest, dtype=torch.int64) for _ in gathered_counts]
        with collective("all_gather (publish ids)", self._group):
            dist.all_gather(gathered, flat, group=self._group)
        per_rank = [torch.split(g[: int(c.sum())], c.tolist()) for g, c in zip(gathered, gathered_counts)]
        # Each table's union is sorted (a sort of every rank's ids) only where this rank reads it: the
        # tables it holds rows of, and every table on rank 0 while a base is being cut (the rows changed
        # meanwhile are marked for the new base's first delta).
        every = self.rank == 0 and self._since_cut is not None
        return [
            torch.cat([parts[t] for parts in per_rank]).unique() if every or self._holds_rows[t] else ids[:0]
            for t, ids in enumerate(local)
        ]

    def _write(self, step: int, changed: list[Tensor], wall_time: float) -> None:
        """Gather the changed rows to rank 0 and write them as the next delta there (in the background)."""
        parts = self._gather(self._local_rows(changed))
        self._sequence += 1
        if self._writer is None:
            return
        rows = self._assemble(changed, parts)
        dense = {
            k[len(self._prefix) :]: v.detach().to("cpu", copy=True)
            for k, v in model_state.dense_state(self._model).items()
            if k.startswith(self._prefix)
        }
        if self._last_write is not None:
            self._check_last_write()
        base, sequence = self._base, self._sequence
        self._last_write = self._writer.submit(
            write_delta, self.dir, base, sequence, step, rows, dense, wall_time=wall_time
        )

    def _local_rows(self, changed: list[Tensor]) -> list[_Piece]:
        """The pieces of ``changed`` this rank holds: whole rows quantized here, as the export quantizes
        them (row-wise: a row's bytes depend on that row alone), so that rank 0 neither gathers fp32 nor
        quantizes every rank's rows; pieces of column-sharded rows stay fp32 (a row's scale needs all of
        it), joined and quantized on rank 0."""
        out = []
        for index, (table, ids) in enumerate(zip(self._pieces, changed)):
            if table.replicated and table.sharding_type != model_state.UNSHARDED:
                if self.rank == 0:  # a data-parallel table: all of it
                    weight = table.pieces[0].weight.detach()
                    out.append(self._piece(index, torch.arange(weight.shape[0]), 0, weight))
                continue
            for piece in table.pieces:
                shard = piece.shard
                inside = ids[(ids >= shard.row_offset) & (ids < shard.row_offset + shard.num_rows)]
                if inside.numel():
                    local = (inside - shard.row_offset).to(piece.weight.device)
                    rows = piece.weight.detach().index_select(0, local)  # not [local]: 3x slower on CPU
                    out.append(self._piece(index, inside, shard.col_offset, rows))
        return out

    def _piece(self, index: int, ids: Tensor, col: int, rows: Tensor) -> _Piece:
        rows = rows.to("cpu", torch.float32)
        if rows.shape[1] != self.tables[index].embedding_dim:
            return _Piece(index, ids, col, rows.contiguous())
        return _Piece(index, ids, col, quantize_kernel_rows(rows, self.options.dtype))

    def _gather(self, local: list[_Piece]) -> list[list[_Piece]]:
        """Every rank's pieces, on rank 0 (others get []): the layouts as objects (a few numbers), the
        bytes in one tensor gather (no pickling of rows); collective."""
        if self._group is None:
            return [local]
        layout = [(p.table, p.ids.numel(), p.col, str(p.rows.dtype), p.rows.shape[1]) for p in local]
        layouts: list[Any] = [None] * dist.get_world_size(self._group)
        with collective("all_gather_object (publish layouts)", self._group):
            dist.all_gather_object(layouts, layout, group=self._group)
        sizes = [sum(8 * n + _aligned(n * w * _ITEM[d]) for _, n, _, d, w in rank) for rank in layouts]
        flat = torch.zeros(max(1, *sizes), dtype=torch.uint8)
        at = 0
        for piece in local:
            for tensor in (piece.ids, piece.rows):
                data = tensor.contiguous().view(torch.uint8).reshape(-1)
                flat[at : at + data.numel()] = data
                at += _aligned(data.numel())  # the next ids start at a multiple of 8 bytes
        gathered = [torch.empty_like(flat) for _ in layouts] if self.rank == 0 else None
        with collective("gather (publish rows)", self._group):
            dist.gather(flat, gathered, dst=0, group=self._group)
        if gathered is None:
            return []
        return [_unpack(buffer, rank) for buffer, rank in zip(gathered, layouts)]

    def _assemble(self, changed: list[Tensor], parts: list[list[_Piece]]) -> dict[str, tuple[Tensor, Tensor]]:
        """Rank 0: each table's changed rows, whole: the quantized rows of every rank as they are, or the
        fp32 pieces of column-sharded rows joined (``write_delta`` quantizes those)."""
        rows: dict[str, tuple[Tensor, Tensor]] = {}
        for index, table in enumerate(self.tables):
            pieces = [p for rank_parts in parts for p in rank_parts if p.table == index]
            if pieces and all(p.rows.dtype == torch.uint8 for p in pieces):
                rows[table.name] = (_joined([p.ids for p in pieces]), _joined([p.rows for p in pieces]))
                continue
            ids = torch.cat([p.ids for p in pieces]).unique() if pieces else changed[index][:0]
            full = torch.zeros(ids.numel(), table.embedding_dim)
            for piece in pieces:
                width = piece.rows.shape[1]
                target = full[:, piece.col : piece.col + width]
                target.index_copy_(0, torch.searchsorted(ids, piece.ids), piece.rows)
            rows[table.name] = (ids, full)
        return rows


@dataclass
class _Piece:
    """Rows ``ids`` of table ``table`` this rank holds, from column ``col``: kernel rows (uint8, whole rows
    quantized) or fp32 values (a column range of the rows)."""

    table: int
    ids: Tensor
    col: int
    rows: Tensor


_ITEM = {"torch.uint8": 1, "torch.float32": 4}


def _unpack(buffer: Tensor, layout: list[tuple[int, int, int, str, int]]) -> list[_Piece]:
    """The pieces ``_gather`` packed into ``buffer`` (views of it)."""
    pieces, at = [], 0
    for table, n, col, dtype, width in layout:
        ids = buffer[at : at + 8 * n].view(torch.int64)
        at += 8 * n
        size = n * width * _ITEM[dtype]
        rows = buffer[at : at + size].view(torch.uint8 if dtype == "torch.uint8" else torch.float32)
        pieces.append(_Piece(table, ids, col, rows.view(n, width)))
        at += _aligned(size)
    return pieces


def _aligned(size: int) -> int:
    return -(-size // 8) * 8


def _in_background(future: Future, name: str, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` on a daemon thread into ``future``: a run that stops on SIGTERM does not wait for a
    base export (what it leaves is a dot-named staging folder, removed by the next run)."""

    def run() -> None:
        lower_thread_priority()
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # noqa: BLE001 - reported by the publisher at the next publish
            future.set_exception(error)

    threading.Thread(target=run, name=name, daemon=True).start()
