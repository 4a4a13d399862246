"""The range of every dense feature a run trained on, recorded in its checkpoints.

A model only ever saw dense values inside this range; far outside it (a client sending +-3.4e38) its
scores can overflow to NaN. ``recserve export`` turns the recorded range into the package's bound on what
serving accepts (refused or clipped, as the package says). Non-finite values in the data are left out of
the range (the data checks report them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.distributed import ShardingEnv

KEY = "dense_range"  # the checkpoint's ``extra`` key


class DenseRange:
    """Per-column min and max of the dense features of the batches this rank trained on (and a resumed
    checkpoint's record)."""

    def __init__(self) -> None:
        self.low: Tensor | None = None
        self.high: Tensor | None = None

    def update(self, dense: Tensor) -> None:
        if dense.dim() != 2 or dense.shape[0] == 0:
            return
        finite = torch.isfinite(dense)
        low = torch.where(finite, dense, torch.inf).amin(0).to("cpu", torch.float64)
        high = torch.where(finite, dense, -torch.inf).amax(0).to("cpu", torch.float64)
        self._merge(low, high)

    def observe(self, stream: Iterator[Any]) -> Iterator[Any]:
        """``stream``'s items (``PositionedBatch``), each batch's dense features counted as it passes."""
        for item in stream:
            batch = getattr(item, "batch", None)  # a followed directory's WAITING has none
            if batch is not None:
                self.update(batch.dense_features)
            yield item

    def restore(self, recorded: dict | None) -> None:
        """Adds a checkpoint's record (``to_dict``'s form); an absent or malformed one adds nothing."""
        try:
            low = torch.tensor(recorded["min"], dtype=torch.float64)
            high = torch.tensor(recorded["max"], dtype=torch.float64)
        except (TypeError, KeyError, ValueError):
            return
        if low.dim() == 1 and low.shape == high.shape:
            self._merge(low, high)

    def gathered(self, env: ShardingEnv | None, device: torch.device | str = "cpu") -> dict | None:
        """The range over every rank (collective when there are several; ``device`` is where the process
        group's backend reduces), as JSON; None before any batch."""
        ranks = env is not None and env.world_size > 1 and dist.is_initialized()
        if self.low is None and not ranks:
            return None
        low, high = self.low, self.high
        if ranks:
            width = torch.tensor([0 if low is None else low.numel()], device=device)
            dist.all_reduce(width, op=dist.ReduceOp.MAX, group=env.pg)
            n = int(width)
            if n == 0:
                return None
            low = torch.full((n,), torch.inf, dtype=torch.float64) if low is None else low
            high = torch.full((n,), -torch.inf, dtype=torch.float64) if high is None else high
            low, high = low.to(device), high.to(device)
            dist.all_reduce(low, op=dist.ReduceOp.MIN, group=env.pg)
            dist.all_reduce(high, op=dist.ReduceOp.MAX, group=env.pg)
            low, high = low.cpu(), high.cpu()
        seen = torch.isfinite(low) & torch.isfinite(high)
        return {
            "min": [float(x) if ok else None for x, ok in zip(low.tolist(), seen.tolist())],
            "max": [float(x) if ok else None for x, ok in zip(high.tolist(), seen.tolist())],
        }

    def _merge(self, low: Tensor, high: Tensor) -> None:
        if self.low is None or self.low.shape != low.shape:
            self.low, self.high = low, high
            return
        self.low = torch.minimum(self.low, low)
        self.high = torch.maximum(self.high, high)
