"""Storage reservations: what a planner keeps off every rank's capacity before placing any shard.

TorchRec's rule (``torchrec.distributed.planner.storage_reservations``): a fixed share of HBM, a fixed
number of HBM bytes, or a heuristic (the dense part's parameters x ``parameter_multiplier`` and its buffers,
20 x the batch's id bytes, and a share of HBM as a margin). ``reserve`` returns a reduced copy of the
topology. rectrain's own memory check (``rectrain.planner.memory``) estimates what a rank holds after
planning; a reservation is what a planner given one plans within.
"""

from __future__ import annotations

import copy
import math
from enum import Enum
from typing import Any

from torch import nn

from rectrain.planner.errors import PlannerError, PlannerErrorType
from rectrain.planner.topology import Storage, Topology
from rectrain.planner.types import ID_BYTES

_KJT_MULTIPLIER = 20  # TorchRec's allowance for the input's copies through the pipeline


class StorageReservationType(str, Enum):
    HEURISTIC = "heuristic"
    FIXED_PERCENTAGE = "fixed_percentage"
    FIXED_ABSOLUTE = "fixed_absolute"


def _get_module_size(module: nn.Module, multiplier: float) -> int:
    params = sum(multiplier * p.numel() * p.element_size() for p in module.parameters())
    return round(params + sum(b.numel() * b.element_size() for b in module.buffers()))


def _on_device(topology: Topology, nbytes: int) -> Storage:
    """``nbytes`` of the memory a plan for ``topology`` lives in (DDR on cpu, HBM otherwise)."""
    cpu = topology.compute_device == "cpu"
    return Storage(hbm=0 if cpu else nbytes, ddr=nbytes if cpu else 0)


def _get_kjt_storage(
    topology: Topology, batch_inputs: list[float], input_data_type_size: int, multiplier: int
) -> Storage:
    return _on_device(topology, math.ceil(sum(batch_inputs) * float(input_data_type_size)) * multiplier)


def _get_batch_inputs_and_shardable_parameters(
    module: nn.Module, sharders: list[Any], batch_size: int, constraints: dict[str, Any] | None = None
) -> tuple[list[float], set[nn.Module]]:
    """Ids per batch of every table a sharder takes, and the modules the sharders take."""
    by_type = {_type_key(s.module_type): s for s in sharders}
    inputs: list[float] = []
    shardable: set[nn.Module] = set()

    def visit(child: nn.Module) -> None:
        sharder = by_type.get(_type_key(type(child)))
        if sharder is None:
            for grandchild in child.children():
                visit(grandchild)
            return
        shardable.add(child)
        for name in sharder.shardable_parameters(child):
            constraint = (constraints or {}).get(name)
            poolings = list(constraint.pooling_factors) if constraint else [1.0]
            batches = (constraint.batch_sizes if constraint else None) or [batch_size] * len(poolings)
            inputs.extend(p * b for p, b in zip(poolings, batches))

    visit(module)
    return inputs, shardable


def _type_key(t: Any) -> str:
    t = t if isinstance(t, type) else type(t)
    return f"{t.__module__}.{t.__name__}"


class FixedPercentageStorageReservation:
    """Keeps ``percentage`` of every rank's HBM; the batch's id storage is computed, not reserved."""

    def __init__(self, percentage: float) -> None:
        assert 0 <= percentage <= 1
        self._percentage = percentage
        self._hbm_bytes = 0
        self._last_reserved_topology: Topology | None = None
        self._kjt_storage: Storage | None = None

    def reserve(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[Any], constraints=None
    ) -> Topology:
        reserved = copy.deepcopy(topology)
        for device in reserved.devices:
            hbm = int((1 - self._percentage) * device.storage.hbm)
            device.storage.hbm = max(0, hbm - self._hbm_bytes) if self._hbm_bytes else hbm
        inputs, _ = _get_batch_inputs_and_shardable_parameters(module, sharders, batch_size, constraints)
        self._kjt_storage = _get_kjt_storage(topology, inputs, ID_BYTES, _KJT_MULTIPLIER)
        self._last_reserved_topology = reserved
        return reserved

    @property
    def last_reserved_topology(self) -> Topology | None:
        return copy.deepcopy(self._last_reserved_topology)


class FixedAbsoluteStorageReservation(FixedPercentageStorageReservation):
    """Keeps ``hbm_reserved_bytes`` of every rank's HBM."""

    def __init__(self, hbm_reserved_bytes: int) -> None:
        assert hbm_reserved_bytes >= 0
        super().__init__(percentage=0.0)
        self._hbm_bytes = hbm_reserved_bytes

    @classmethod
    def from_gb(cls, hbm_reserved_gb: float) -> FixedAbsoluteStorageReservation:
        return cls(int(hbm_reserved_gb * 1024**3))


class HeuristicalStorageReservation:
    """Keeps ``percentage`` of HBM, the dense part's estimate (``dense_tensor_estimate`` bytes, or its
    parameters x ``parameter_multiplier`` and buffers) and 20 x the batch's id bytes on every rank."""

    def __init__(
        self, percentage: float, parameter_multiplier: float = 6.0, dense_tensor_estimate: int | None = None
    ) -> None:
        assert 0 <= percentage <= 1
        self._percentage = percentage
        self._parameter_multiplier = parameter_multiplier
        self._dense_tensor_estimate = dense_tensor_estimate
        self._dense_storage: Storage | None = None
        self._kjt_storage: Storage | None = None
        self._last_reserved_topology: Topology | None = None

    def reserve(
        self, topology: Topology, batch_size: int, module: nn.Module, sharders: list[Any], constraints=None
    ) -> Topology:
        reserved = copy.deepcopy(topology)
        inputs, shardable = _get_batch_inputs_and_shardable_parameters(
            module, sharders, batch_size, constraints
        )
        dense = self._dense_tensor_estimate or _get_module_size(module, self._parameter_multiplier) - sum(
            _get_module_size(m, self._parameter_multiplier) for m in shardable
        )
        self._dense_storage = _on_device(topology, dense)
        self._kjt_storage = _get_kjt_storage(topology, inputs, ID_BYTES, _KJT_MULTIPLIER)
        for device in reserved.devices:
            device.storage.hbm = int((1 - self._percentage) * device.storage.hbm)
            device.storage -= self._dense_storage + self._kjt_storage
        if reserved.devices[0].storage.hbm < 0:
            raise PlannerError(
                f"the reserved topology has {reserved.devices[0].storage.hbm:,} bytes of HBM per rank "
                f"after keeping {self._percentage:.0%} of HBM, the dense part ({dense:,} bytes) and the "
                f"batch's ids ({self._kjt_storage.hbm:,} bytes): lower the batch size ({batch_size}) or the "
                "percentage, pass dense_tensor_estimate, or use FixedPercentageStorageReservation",
                PlannerErrorType.INSUFFICIENT_STORAGE,
            )
        self._last_reserved_topology = copy.deepcopy(reserved)
        return reserved

    @property
    def last_reserved_topology(self) -> Topology | None:
        return self._last_reserved_topology
