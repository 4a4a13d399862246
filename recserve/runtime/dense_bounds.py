"""The bound a package puts on dense inputs: the training data's range, widened, refused or clipped beyond.

A model has only seen dense values inside its training data's range; a client's +-3.4e38 (finite, so
accepted as a number) can overflow its layers to NaN. Training records each column's range
(``rectrain.train.dense_range``); export writes it into the manifest, widened on each side by ten times the
column's scale (its span, its largest magnitude or 1, whichever is largest: serving traffic drifts, and test
clients send standard-normal values to models trained on [0, 1]), with the action the exporter chose:

    "dense_bounds": {"min": [..], "max": [..], "action": "refuse" | "clip", "source": "..."}

A column with ``null`` bounds was never seen finite in training and is not bounded. The server applies the
bound to every request (``refuse``: INVALID_ARGUMENT naming the example and column; ``clip``: clamped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError, PackageError

ACTIONS = ("refuse", "clip")
WIDEN = 10.0


def bounds_from_range(dense_range: dict[str, Any], action: str, source: str = "") -> dict[str, Any]:
    """The manifest's ``dense_bounds`` for a training range ``{"min": [..], "max": [..]}``."""
    if action not in ACTIONS:
        raise ValueError(f"dense bounds action: expected one of {list(ACTIONS)}, got {action!r}")
    low, high = [], []
    for lo, hi in zip(dense_range["min"], dense_range["max"]):
        if lo is None or hi is None:
            low.append(None)
            high.append(None)
            continue
        lo, hi = float(lo), float(hi)
        margin = WIDEN * max(hi - lo, abs(lo), abs(hi), 1.0)
        low.append(lo - margin)
        high.append(hi + margin)
    return {"min": low, "max": high, "action": action, "source": source}


@dataclass(frozen=True)
class DenseBounds:
    """Per-column ``[low, high]`` (float32 ``[W]``; +-inf where unbounded) and what to do beyond them."""

    low: Tensor
    high: Tensor
    clip: bool

    @staticmethod
    def parse(data: Any, width: int, where: str) -> DenseBounds | None:
        """From a manifest's ``dense_bounds`` (None: no bound); PackageError naming the field if malformed."""
        if data is None:
            return None
        field = f"{where}: dense_bounds"
        if not isinstance(data, dict) or data.get("action") not in ACTIONS:
            raise PackageError(f"{field}: expected an object with 'action' one of {list(ACTIONS)}")
        columns = []
        for key, missing in (("min", -math.inf), ("max", math.inf)):
            values = data.get(key)
            if not isinstance(values, list) or len(values) != width:
                raise PackageError(f"{field}.{key}: expected a list of {width} numbers or nulls")
            if any(v is not None and (not isinstance(v, (int, float)) or math.isnan(v)) for v in values):
                raise PackageError(f"{field}.{key}: expected numbers or nulls")
            columns.append(torch.tensor([missing if v is None else v for v in values], dtype=torch.float32))
        low, high = columns
        if bool((low > high).any()):
            raise PackageError(f"{field}: a column's min is above its max")
        return DenseBounds(low, high, data["action"] == "clip")

    def apply(self, dense: Tensor) -> Tensor:
        """``dense`` ``[B, W]`` within the bounds: as it is, clipped, or InvalidRequestError naming where."""
        outside = (dense < self.low) | (dense > self.high)
        if not bool(outside.any()):
            return dense
        if self.clip:
            return torch.clamp(dense, self.low, self.high)
        row, col = (int(i) for i in outside.nonzero()[0])
        raise InvalidRequestError(
            f"dense[{row}][{col}]: {float(dense[row, col]):g} is outside [{float(self.low[col]):g}, "
            f"{float(self.high[col]):g}], the range this model accepts for dense feature {col} (its training "
            "data's range, widened; recorded at export)"
        )
