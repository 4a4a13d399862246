"""The hardware a plan is made for: ranks, hosts, per-rank memory and bandwidths.

Defaults follow ``torchrec.distributed.planner.constants`` where the concept is the same. Sizes are bytes,
bandwidths bytes per second.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)

GIB = 1024**3
HBM_CAP = 32 * GIB  # used for cuda plans made on a machine without a CUDA device
DDR_CAP = 128 * GIB  # used when the host's memory cannot be read
HBM_MEM_BW = 897e9  # V100-class HBM2 read bandwidth (TorchRec's default)
DDR_MEM_BW = 51e9  # dual-channel DDR4 server socket (TorchRec's default)
INTRA_HOST_BW = 600e9  # NVLink-class bandwidth between the ranks of one host
INTER_HOST_BW = 12.5e9  # 100 Gbit/s network between hosts
BWD_COMPUTE_MULTIPLIER = 2.0  # backward lookup work relative to forward (TorchRec's default)

_COMPUTE_DEVICES = ("cpu", "cuda", "mtia")  # mtia: planned as an HBM device, as TorchRec does


@dataclass
class Storage:
    """Bytes of device (HBM) and host (DDR) memory, and of SSD: what a rank has, or what a shard needs
    (``torchrec.distributed.planner.types.Storage``)."""

    hbm: int
    ddr: int
    ssd: int = 0

    def __add__(self, other: Storage) -> Storage:
        return Storage(self.hbm + other.hbm, self.ddr + other.ddr, self.ssd + other.ssd)

    def __sub__(self, other: Storage) -> Storage:
        return Storage(self.hbm - other.hbm, self.ddr - other.ddr, self.ssd - other.ssd)

    def fits_in(self, other: Storage) -> bool:
        """Whether every kind of memory this needs is within ``other``'s."""
        return self.hbm <= other.hbm and self.ddr <= other.ddr and self.ssd <= other.ssd


@dataclass
class DeviceHardware:
    """One rank of the topology, the memory it may use, and the load placed on it (a partitioner's
    ``Perf``; None: nothing placed)."""

    rank: int
    storage: Storage
    perf: Any = None


def host_memory_bytes() -> int:
    """Physical memory of this host, read with ``os.sysconf`` (no psutil); ``DDR_CAP`` if unavailable."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        logger.warning("cannot read the host memory size; assuming %d bytes", DDR_CAP)
        return DDR_CAP


def _device_memory_bytes(device: str) -> int:
    if device == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    logger.info("planning for %s without that device; assuming %d bytes of HBM per rank", device, HBM_CAP)
    return HBM_CAP


@dataclass
class Topology:
    """World geometry and per-rank capacities (``torchrec.distributed.planner.Topology``).

    ``local_world_size`` is the number of ranks per host (default: all ranks on one host). Unset caps are
    detected: ``hbm_cap`` from the CUDA device (cuda only; 0 on cpu), ``ddr_cap`` as this host's memory
    divided by its local ranks. On ``cpu`` the plan is bounded by ``ddr_cap``, on ``cuda`` by ``hbm_cap``.
    """

    world_size: int
    compute_device: str = "cpu"
    hbm_cap: int | None = None
    ddr_cap: int | None = None
    local_world_size: int | None = None
    hbm_mem_bw: float = HBM_MEM_BW
    ddr_mem_bw: float = DDR_MEM_BW
    intra_host_bw: float = INTRA_HOST_BW
    inter_host_bw: float = INTER_HOST_BW
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    devices: list[DeviceHardware] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._validate_geometry()
        if self.compute_device not in _COMPUTE_DEVICES:
            raise ConfigError(
                f"compute_device must be one of {_COMPUTE_DEVICES}, got {self.compute_device!r}"
            )
        for name in ("hbm_mem_bw", "ddr_mem_bw", "intra_host_bw", "inter_host_bw", "bwd_compute_multiplier"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.hbm_cap is None:
            self.hbm_cap = _device_memory_bytes(self.compute_device) if self.compute_device != "cpu" else 0
        if self.ddr_cap is None:
            self.ddr_cap = host_memory_bytes() // self.local_world_size
        for name in ("hbm_cap", "ddr_cap"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative int of bytes, got {value!r}")
        # One Storage per device: a storage reservation lowers them in place, as TorchRec's do.
        self.devices = [
            DeviceHardware(r, Storage(hbm=self.hbm_cap, ddr=self.ddr_cap)) for r in range(self.world_size)
        ]

    def _validate_geometry(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size <= 0:
            raise ConfigError(f"world_size must be a positive int, got {self.world_size!r}")
        if self.local_world_size is None:
            self.local_world_size = self.world_size
        if not isinstance(self.local_world_size, int) or self.local_world_size <= 0:
            raise ConfigError(f"local_world_size must be a positive int, got {self.local_world_size!r}")
        if self.world_size % self.local_world_size != 0:
            raise ConfigError(
                f"world_size ({self.world_size}) must be a multiple of local_world_size "
                f"({self.local_world_size}): every host runs the same number of ranks"
            )

    @property
    def intra_group_size(self) -> int:
        """Ranks per host (TorchRec's name for ``local_world_size``)."""
        return self.local_world_size

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def mem_bw(self) -> float:
        """Bandwidth of the memory the embedding rows live in (HBM on cuda, DDR on cpu)."""
        return self.ddr_mem_bw if self.compute_device == "cpu" else self.hbm_mem_bw

    @property
    def comm_bw(self) -> float:
        """Bandwidth of a world-wide collective: the inter-host link once the world spans hosts."""
        return self.inter_host_bw if self.num_hosts > 1 else self.intra_host_bw

    def capacity(self, rank: int) -> int:
        """Bytes a plan may use on ``rank`` (HBM on cuda, DDR on cpu)."""
        storage = self.devices[rank].storage
        return storage.ddr if self.compute_device == "cpu" else storage.hbm

    def host_of(self, rank: int) -> int:
        return rank // self.local_world_size
