"""Runs the compiled fused backward (``rectrain.embedding.cpu_kernel``) for one TBE on a thread pool.

``CompiledBackward`` holds what does not change between steps: the TBE layout as small int arrays, the
``counts`` scratch (one int32 per table row, zero between steps) and each worker's scratch. Every step it
splits the tables (or row parts of tables) over ``torch.get_num_threads()`` workers, balanced by the number
of ids each table read, and runs them with the GIL released.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

from rectrain.embedding import cpu_kernel
from rectrain.embedding.config import EmbOptimType, PoolingType
from rectrain.embedding.sparse_adam import TBELayout

_OPTIMIZER_CODES = {
    EmbOptimType.SGD: cpu_kernel.SGD,
    EmbOptimType.ADAGRAD: cpu_kernel.ADAGRAD,
    EmbOptimType.ROWWISE_ADAGRAD: cpu_kernel.ROWWISE_ADAGRAD,
    EmbOptimType.ADAM: cpu_kernel.ADAM,
}
_POOLING_CODES = {
    PoolingType.SUM: cpu_kernel.POOL_SUM,
    PoolingType.MEAN: cpu_kernel.POOL_MEAN,
    PoolingType.NONE: cpu_kernel.POOL_NONE,
}
logger = logging.getLogger(__name__)
_POOL_LOCK = threading.Lock()
_POOL: list[tuple[ThreadPoolExecutor, int]] = []  # (pool, pid that made it)
_EMPTY_F32 = np.zeros(0, np.float32)


def _pool(workers: int) -> ThreadPoolExecutor:
    """One process-wide pool with at least ``workers`` threads (the calling thread is one more worker).

    Re-made after a fork: the child inherits the pool object but none of its threads."""
    with _POOL_LOCK:
        stale = not _POOL or _POOL[0][1] != os.getpid() or _POOL[0][0]._max_workers < workers  # noqa: SLF001
        if stale:
            _POOL[:] = [
                (ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rectrain-emb-bwd"), os.getpid())
            ]
        return _POOL[0][0]


def _i64(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def split_tasks(ids_per_table: Sequence[int], workers: int) -> tuple[int, list[np.ndarray]]:
    """Row parts per table and, per worker, its task list (``table * parts + part``), balanced by ids.

    With fewer than two tables read per worker, every table is split into row parts (a power of two) so
    that even one table keeps every worker busy; tasks go largest first to the least loaded worker.
    """
    read = [t for t, n in enumerate(ids_per_table) if n]
    wanted = math.ceil(2 * workers / max(1, len(read))) if workers > 1 else 1
    parts = 1 << max(0, wanted - 1).bit_length()  # a power of two: the kernel masks instead of dividing
    loads = [0.0] * workers
    assigned: list[list[int]] = [[] for _ in range(workers)]
    for t in sorted(read, key=lambda t: -ids_per_table[t]):
        for part in range(parts):
            w = loads.index(min(loads))
            loads[w] += ids_per_table[t] / parts
            assigned[w].append(t * parts + part)
    return parts, [_i64(tasks) for tasks in assigned if tasks]


class CompiledBackward:
    """The compiled fused backward of one TBE: its layout, state offsets and scratch.

    Args:
        layout: the TBE's tables and features.
        optimizer: which update to apply.
        pooling: SUM, MEAN or NONE (sequence).
        state_offsets: per table, where its optimizer state starts in the flat state buffer(s) (Adagrad and
            Adam: in floats, like the weights; row-wise Adagrad: in rows).
    """

    def __init__(
        self,
        layout: TBELayout,
        optimizer: EmbOptimType,
        pooling: PoolingType,
        state_offsets: Sequence[int],
    ) -> None:
        self.layout = layout
        self.optimizer = _OPTIMIZER_CODES[optimizer]
        self.pooling = _POOLING_CODES[pooling]
        tables = range(layout.num_tables)
        feats = [f for t in tables for f, ft in enumerate(layout.feature_table_map) if ft == t]
        per_table = [layout.feature_table_map.count(t) for t in tables]
        cols = layout.D_offsets[:-1] if pooling is not PoolingType.NONE else [0] * len(feats)
        # The order of cpu_kernel's FEATURE_PTR .. STATE_OFFSETS.
        self._lay = tuple(
            _i64(values)
            for values in (
                [0, *np.cumsum(per_table).tolist()],
                feats,
                cols,
                layout.table_rows,
                [0, *np.cumsum(layout.table_rows)[:-1].tolist()],
                layout.table_dims,
                layout.weights_offsets,
                state_offsets,
            )
        )
        self._counts = np.zeros(sum(layout.table_rows), dtype=np.int32)
        self._scratch: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def _worker_scratch(self, workers: int, capacity: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per worker: rows (int32), CSC gradient offsets (int64), scales (fp32), ``capacity`` long."""
        if len(self._scratch) < workers or self._scratch[0][0].size < capacity:
            size = max(capacity, self._scratch[0][0].size if self._scratch else 0)
            self._scratch = [
                (np.empty(size, np.int32), np.empty(size, np.int64), np.empty(size, np.float32))
                for _ in range(max(workers, len(self._scratch)))
            ]
        return self._scratch

    def run(
        self,
        inputs: tuple[Tensor, Tensor, Tensor, Tensor | None],
        weights: Tensor,
        states: Sequence[Tensor],
        hyper: Sequence[float],
        step_sizes: Sequence[float] | None = None,
    ) -> None:
        """Update ``weights`` and ``states`` (flat fp32 buffers) in place from the lookup's
        ``(grad_output, indices, offsets, per_sample_weights)``.

        ``hyper`` is ``(lr, eps, 1 - beta1, 1 - beta2, weight_decay)``; ``step_sizes`` (Adam) one per table.
        """
        grad_output, indices, offsets, per_sample_weights = inputs
        batch = (offsets.numel() - 1) // self.layout.num_features
        if batch == 0 or indices.numel() == 0:
            return
        if indices.numel() >= 2**31 - 1:
            raise ValueError(f"the compiled backward takes < 2**31 ids per batch, got {indices.numel()}")
        ids = (_numpy(indices, torch.int64), _numpy(offsets, torch.int64), _EMPTY_F32)
        if per_sample_weights is not None:
            ids = (ids[0], ids[1], _numpy(per_sample_weights, torch.float32))
        grad = _numpy(grad_output, torch.float32)
        ids_per_table = [0] * self.layout.num_tables
        bounds = ids[1][::batch]
        for f, t in enumerate(self.layout.feature_table_map):
            ids_per_table[t] += int(bounds[f + 1] - bounds[f])
        parts, worker_tasks = split_tasks(ids_per_table, max(1, torch.get_num_threads()))
        scratch = self._worker_scratch(len(worker_tasks), max(ids_per_table) + 1)  # +1: see _order_rows
        store = tuple(_numpy(t, torch.float32) for t in (weights, *states))
        store += (_EMPTY_F32,) * (3 - len(store))
        steps = np.asarray(step_sizes if step_sizes is not None else [0.0] * len(ids_per_table), np.float64)
        args = (parts, batch, self.pooling, ids, grad.reshape(-1), grad.shape[1], self._lay)
        args += (store, steps, np.asarray(hyper, np.float64), self._counts)
        run = cpu_kernel.RUN_TASKS[self.optimizer]
        jobs = [
            _pool(len(worker_tasks) - 1).submit(run, tasks, *args, scratch[w])
            for w, tasks in enumerate(worker_tasks[1:], start=1)
        ]
        bad = [run(worker_tasks[0], *args, scratch[0])] + [job.result() for job in jobs]
        if max(bad) >= 0:
            pos = next(b for b in bad if b >= 0)
            raise ValueError(
                f"embedding backward: id {int(ids[0][pos])} at position {pos} is out of range for its table"
            )


def _numpy(tensor: Tensor, dtype: torch.dtype) -> np.ndarray:
    """A contiguous numpy view of ``tensor`` as ``dtype`` (a copy only where a cast or layout needs one).

    In-place buffers (weights, state) must already be contiguous in ``dtype``, or updates would be lost."""
    return tensor.detach().to(dtype).contiguous().numpy()


@functools.cache
def compiled_ready() -> bool:
    """Whether the compiled backward runs here: numba imports and the kernel compiles (or loads from numba's
    cache) and updates a tiny table correctly. Checked once per process; a failure is logged and the
    callers fall back (FBGEMM's backward, or the torch-ops one)."""
    if not cpu_kernel.available():
        return False
    try:
        layout = TBELayout.from_tables([4], [4])
        weights, state = torch.zeros(16), torch.zeros(4)
        grad = torch.ones(1, 4)
        inputs = (grad, torch.tensor([1, 1]), torch.tensor([0, 2]), None)
        backward = CompiledBackward(layout, EmbOptimType.ROWWISE_ADAGRAD, PoolingType.SUM, [0])
        backward.run(inputs, weights, [state], (1.0, 0.0, 0.0, 0.0, 0.0))
        # the row's gradient is 2 (two ids), so momentum 4 and the weight moves by -2 / sqrt(4)
        ok = bool(state[1] == 4.0) and bool((weights.view(4, 4)[1] == -1.0).all())
    except Exception:  # noqa: BLE001 - any failure to build the kernel means: use the fallback
        logger.warning("compiled CPU embedding backward unavailable; falling back", exc_info=True)
        return False
    if not ok:
        logger.warning("compiled CPU embedding backward failed its self-check; falling back")
    return ok
