"""Ids outside their tables, caught on the sender before the input distribution routes them.

Checked on the sender because a row-wise bucketiser maps some out-of-range ids to valid rows of the wrong
shard. On the host (CPU tensors) the check raises at once. On a GPU, reading the verdict back would stall
the host every step until the GPU caught up, so there the check runs on the device and its verdict (flag,
position, id, feature) is copied into pinned host memory without waiting; a later call reads the verdicts
whose copies have landed and raises for the first bad one, naming the feature, the id and how many batches
ago it came. Meanwhile FBGEMM's bounds check (``BoundsCheckMode.WARNING`` on CUDA) has looked the bad id up
as row 0 rather than read out of bounds.

The sharder's ``fused_params["bounds_check_mode"]`` chooses what a bad id does, with FBGEMM's meanings:
``FATAL`` (rectrain's default: never silent) raises; ``WARNING`` logs the first bad id of the batch and looks
every bad id up as row 0; ``IGNORE`` looks them up as row 0 silently; ``NONE`` checks nothing here (the
CPU kernel's own check still refuses an id outside its shard).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode
from torch import Tensor

logger = logging.getLogger(__name__)

# Verdicts in flight before a check waits for the oldest (the host is then this many batches ahead of the
# GPU, far more than a pipeline keeps: a safety bound, not a tuning knob).
_MAX_PENDING = 64


@dataclass
class _Verdict:
    """One batch's device-side verdict on its way to the host: [bad, position, id, feature]."""

    host: Tensor
    ready: torch.cuda.Event | None
    batch: int


class IdCheck:
    """Raise ``ValueError`` naming the feature when an id lies outside its table (or, by ``mode``, warn
    and look it up as row 0: see the module doc).

    Args:
        features: the routed features, in the order of ``LocalFeatures.lengths``' rows.
        rows: each feature's table size.
        deferred: check on the device and report later (default: when the ids are on a GPU).
        mode: FBGEMM's ``BoundsCheckMode``.
    """

    def __init__(
        self,
        features: Sequence[str],
        rows: Sequence[int],
        deferred: bool | None = None,
        mode: BoundsCheckMode = BoundsCheckMode.FATAL,
    ) -> None:
        self.mode = BoundsCheckMode(mode)
        self.features = tuple(features)
        self.rows = torch.tensor(list(rows), dtype=torch.int64)
        self._smallest = min(rows, default=0)
        self.deferred = deferred
        self._rows_on: dict[torch.device, Tensor] = {}
        self._pending: deque[_Verdict] = deque()
        self._batches = 0

    def __call__(self, lengths: Tensor, values: Tensor) -> Tensor:
        """Check one batch: ``lengths`` is ``[features, batch]``, ``values`` the ids feature by feature.
        Returns the ids to look up (``values`` itself unless bad ids became row 0)."""
        if self.mode is BoundsCheckMode.NONE:
            return values
        self._batches += 1
        deferred = values.is_cuda if self.deferred is None else self.deferred
        if self.mode is not BoundsCheckMode.IGNORE:
            if not deferred:
                self._check_now(lengths, values)
            else:
                self.report()
                if values.numel():
                    self._pending.append(self._start(lengths, values))
                if len(self._pending) > _MAX_PENDING:
                    self.report(wait=True)
        if self.mode is BoundsCheckMode.FATAL or values.numel() == 0:
            return values
        return values.masked_fill(self._bad(lengths, values)[0], 0)

    def _rows(self, device: torch.device) -> Tensor:
        if device not in self._rows_on:
            self._rows_on[device] = self.rows.to(device)
        return self._rows_on[device]

    def _bad(self, lengths: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        counts = lengths.sum(dim=1)
        # output_size: the number of ids is known on the host, so no readback to size the result.
        limits = torch.repeat_interleave(self._rows(values.device), counts, output_size=values.numel())
        return (values < 0) | (values >= limits), counts

    def _check_now(self, lengths: Tensor, values: Tensor) -> None:
        if values.numel() == 0:
            return
        low, high = torch.aminmax(values)
        if int(low) >= 0 and int(high) < self._smallest:
            return  # usually one pass: ids within the smallest table's range need no per-feature check
        bad, counts = self._bad(lengths, values)
        if not bool(bad.any()):
            return
        position = int(bad.nonzero()[0, 0])
        feature = int(torch.searchsorted(counts.cumsum(0), position, right=True))
        self._raise(feature, int(values[position]), 0)

    def _start(self, lengths: Tensor, values: Tensor) -> _Verdict:
        bad, counts = self._bad(lengths, values)
        position = bad.to(torch.int8).argmax().view(1)  # the first bad id (0 when none is)
        feature = torch.searchsorted(counts.cumsum(0), position, right=True)
        verdict = torch.cat([bad.any().view(1).long(), position, values.index_select(0, position), feature])
        if not values.is_cuda:  # the CPU stand-in (tests): the verdict is already on the host
            return _Verdict(verdict, None, self._batches)
        host = torch.empty(4, dtype=torch.int64, pin_memory=True)
        host.copy_(verdict, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return _Verdict(host, ready, self._batches)

    def report(self, wait: bool = False) -> None:
        """Raise for the oldest bad batch whose verdict has reached the host (``wait``: wait for every
        verdict in flight)."""
        while self._pending:
            verdict = self._pending[0]
            if verdict.ready is not None and not verdict.ready.query():
                if not wait:
                    return
                verdict.ready.synchronize()
            self._pending.popleft()
            bad, _, value, feature = verdict.host.tolist()
            if bad:
                self._pending.clear()
                self._raise(feature, value, self._batches - verdict.batch)

    def _raise(self, feature: int, value: int, batches_ago: int) -> None:
        when = f" (in the batch {batches_ago} before this one)" if batches_ago else ""
        message = (
            f"feature {self.features[feature]!r}: id {value} is out of range for its table "
            f"(num_embeddings={int(self.rows[feature])}){when}"
        )
        if self.mode is BoundsCheckMode.WARNING:
            logger.warning("%s; looked up as row 0 (bounds_check_mode=WARNING)", message)
            return
        raise ValueError(message)
