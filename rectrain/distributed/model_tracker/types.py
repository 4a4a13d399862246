"""``torchrec.distributed.model_tracker.types``: the records and modes of TorchRec's delta tracking."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


@dataclass
class IndexedLookup:
    """One batch's looked-up ids of a table, with their states (embeddings or optimizer state) if tracked."""

    batch_idx: int
    ids: torch.Tensor
    states: torch.Tensor | None
    compact: bool = False


@dataclass
class UniqueRows:
    """A table's unique ids over some batches, with one state per id (``UpdateMode`` says which)."""

    ids: torch.Tensor
    states: torch.Tensor | None


class TrackingMode(Enum):
    ID_ONLY = "id_only"
    EMBEDDING = "embedding"
    MOMENTUM_LAST = "momentum_last"
    MOMENTUM_DIFF = "momentum_diff"
    ROWWISE_ADAGRAD = "rowwise_adagrad"


class UpdateMode(Enum):
    """Which state an id seen in several batches keeps: none (ids only), its first, or its last."""

    NONE = "none"
    FIRST = "first"
    LAST = "last"
