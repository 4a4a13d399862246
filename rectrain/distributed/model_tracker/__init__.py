"""``torchrec.distributed.model_tracker``: TorchRec's delta store and its types (no ModelDeltaTracker)."""

from rectrain.distributed.model_tracker.delta_store import DeltaStore
from rectrain.distributed.model_tracker.types import IndexedLookup, TrackingMode, UniqueRows, UpdateMode

__all__ = ["DeltaStore", "IndexedLookup", "TrackingMode", "UniqueRows", "UpdateMode"]
