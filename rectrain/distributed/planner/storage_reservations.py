"""``torchrec.distributed.planner.storage_reservations``: ``rectrain.planner.reservations`` re-exported."""

from rectrain.planner.reservations import (
    FixedAbsoluteStorageReservation,
    FixedPercentageStorageReservation,
    HeuristicalStorageReservation,
    StorageReservationType,
    _get_batch_inputs_and_shardable_parameters,
    _get_kjt_storage,
    _get_module_size,
)

__all__ = [
    "FixedAbsoluteStorageReservation",
    "FixedPercentageStorageReservation",
    "HeuristicalStorageReservation",
    "StorageReservationType",
    "_get_batch_inputs_and_shardable_parameters",
    "_get_kjt_storage",
    "_get_module_size",
]
