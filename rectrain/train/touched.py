"""Which rows of each table the trained batches read: the rows a delta must carry.

The fused optimizers update only the rows a batch reads (every sparse optimizer rectrain offers: a row's
state moves only with its gradient), so the rows to publish are the ids of the trained batches, marked in one
bitmap per table as each batch leaves the data stream. Marking happens when the pipeline fetches a batch,
which may be a step or two before it trains; ``take`` therefore marks again, after it clears, the batches
fetched but not trained yet (told how many batches have trained: the trainer trains them in the order they
were fetched, one a step; not told, the most recent few), so a row read by a batch not yet trained is never
lost, and a row whose batch has trained is not published again (that would cost bytes, never exactness:
with a delta a step or two, marking trained batches again made each delta carry several steps' rows).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

# Batches a pipeline may hold between fetching and training one (TrainPipelineSparseDist holds one or two).
_IN_FLIGHT = 3


class TouchedRows:
    """Per-table bitmaps of the rows read by this rank's batches since the last ``take``.

    Args:
        tables: the model's table configs (``name``, ``num_embeddings``, ``feature_names``), in table order.
    """

    def __init__(self, tables: Sequence[Any]) -> None:
        self._table_of = {f: i for i, t in enumerate(tables) for f in t.feature_names}
        self._marks = [torch.zeros(t.num_embeddings, dtype=torch.bool) for t in tables]
        self._recent: deque[tuple[int, list[tuple[int, Tensor]]]] = deque(maxlen=_IN_FLIGHT)
        self._fetched = 0  # batches marked so far: the next one's index

    def observe(self, stream: Iterator[Any]) -> Iterator[Any]:
        """``stream`` (``Batch``es or ``PositionedBatch``es) unchanged, each batch's ids marked."""
        for item in stream:
            batch = getattr(item, "batch", item)
            if not hasattr(batch, "sparse_features"):  # a followed directory's WAITING: no batch
                yield item
                continue
            ids = self._ids_of(batch.sparse_features)
            self._recent.append((self._fetched, ids))
            self._fetched += 1
            self._mark(ids)
            yield item

    def _ids_of(self, kjt: Any) -> list[tuple[int, Tensor]]:
        values = kjt.values().detach().to("cpu", torch.int64)
        ids = []
        for key, part in zip(kjt.keys(), torch.split(values, kjt.length_per_key())):
            table = self._table_of.get(key)
            if table is not None:
                size = self._marks[table].numel()
                ids.append((table, part[(part >= 0) & (part < size)]))  # ids out of range train nothing
        return ids

    def _mark(self, ids: list[tuple[int, Tensor]]) -> None:
        for table, part in ids:
            self._marks[table][part] = True

    def take(self, trained: int | None = None) -> list[Tensor]:
        """Each table's marked row ids (sorted int64), then clear all but the batches still in flight: those
        past the first ``trained`` batches fetched, or (None) the last few fetched."""
        taken = [marks.nonzero().squeeze(1) for marks in self._marks]
        for marks, ids in zip(self._marks, taken):
            marks.index_fill_(0, ids, False)  # the marked rows only, not the whole bitmap
        for index, ids in self._recent:
            if trained is None or index >= trained:
                self._mark(ids)
        return taken
