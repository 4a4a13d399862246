"""The hardware a plan is made for: ranks, hosts, per-rank memory and bandwidths
(``torchrec.distributed.planner.types.Topology`` and the records it is built from).

Defaults and units are TorchRec's (``torchrec.distributed.planner.constants``): sizes in bytes, bandwidths in
bytes per millisecond. rectrain's perf model reads ``Topology.mem_bw`` and ``comm_bw``, in bytes per second.
"""

from __future__ import annotations

import abc
import logging
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from rectrain.errors import ConfigError
from rectrain.planner.context_hash import hash_sha256_to_int
from rectrain.planner.types import GIB

logger = logging.getLogger(__name__)

HBM_CAP = 32 * GIB  # used for cuda plans made on a machine without a CUDA device
DDR_CAP = 128 * GIB  # used when the host's memory cannot be read
SSD_CAP = 2 * 1024**4  # TorchRec's default SSD per rank; rectrain's default is 0 (it runs no SSD kernel)
# Bandwidths in bytes/ms (TorchRec's unit and figures, ``torchrec.distributed.planner.constants``).
HBM_MEM_BW = 897 * GIB / 1000  # V100-class HBM2 read bandwidth
DDR_MEM_BW = 51 * GIB / 1000  # dual-channel DDR4 server socket
SSD_MEM_BW = 100 * 1024**2 / 1000
HBM_TO_DDR_MEM_BW = 32 * GIB / 1000  # PCIe between a device and host memory (UVM)
INTRA_HOST_BW = 600 * GIB / 1000  # NVLink-class bandwidth between the ranks of one host
INTER_HOST_BW = 12.5 * GIB / 1000  # 100 Gbit/s network between hosts
BWD_COMPUTE_MULTIPLIER = 2.0  # backward lookup work relative to forward
WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER = 1.0

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


class CollectiveType(Enum):
    ALL_TO_ALL = "all_to_all"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_REDUCE = "all_reduce"


class GeneralizedCommsBandwidth(abc.ABC):
    """A bandwidth model of collectives (bytes/ms), given to a :class:`Topology` in place of two figures."""

    @abc.abstractmethod
    def get_bw(self, local_world_size: int, world_size: int, collective_type: CollectiveType) -> float: ...

    @property
    @abc.abstractmethod
    def intra_host_bw(self) -> float: ...

    @property
    @abc.abstractmethod
    def inter_host_bw(self) -> float: ...


class BasicCommsBandwidths(GeneralizedCommsBandwidth):
    """One bandwidth inside a host, one across hosts (an all-reduce uses one NIC per rank of the host)."""

    def __init__(self, inter_host_bw: float = INTER_HOST_BW, intra_host_bw: float = INTRA_HOST_BW) -> None:
        self.name = "BasicCommsBandwidths"
        self._inter_host_bw, self._intra_host_bw = inter_host_bw, intra_host_bw

    def __str__(self) -> str:
        return f"{self.name}: inter_host_bw={self.inter_host_bw}, intra_host_bw={self.intra_host_bw}"

    @property
    def inter_host_bw(self) -> float:
        return self._inter_host_bw

    @property
    def intra_host_bw(self) -> float:
        return self._intra_host_bw

    def get_bw(self, local_world_size: int, world_size: int, collective_type: CollectiveType) -> float:
        if collective_type == CollectiveType.ALL_REDUCE:
            return self.inter_host_bw * local_world_size
        return self.intra_host_bw if world_size <= local_world_size else self.inter_host_bw

    def __hash__(self) -> int:
        return hash((self._inter_host_bw, self._intra_host_bw))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BasicCommsBandwidths) and hash(self) == hash(other)


class CustomTopologyData:
    """Per-rank capacities (``{"hbm_cap" | "ddr_cap" | "ssd_cap": [bytes per rank]}``) for uneven hosts."""

    supported_fields = ["ddr_cap", "hbm_cap", "ssd_cap"]

    def __init__(self, data: dict[str, list[int]], world_size: int) -> None:
        unknown = sorted(set(data) - set(self.supported_fields))
        if unknown:
            raise ConfigError(f"CustomTopologyData: {unknown} not supported (only {self.supported_fields})")
        wrong = sorted(k for k, v in data.items() if len(v) != world_size)
        if wrong:
            raise ConfigError(f"CustomTopologyData: {wrong} must have one value per rank ({world_size})")
        self._data, self._world_size = data, world_size

    def get_data(self, key: str) -> list[int]:
        return self._data[key]

    def has_data(self, key: str) -> bool:
        return key in self._data


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
    """World geometry and per-rank capacities (TorchRec's ``Topology``, its arguments in its order).

    ``local_world_size`` is the number of ranks per host (default: all ranks on one host); ``pod_size``
    hosts share the fast interconnect (``intra_group_size``). Unset caps are detected: ``hbm_cap`` from the
    CUDA device (cuda only; 0 on cpu), ``ddr_cap`` as this host's memory divided by its local ranks (TorchRec:
    128 GiB), ``ssd_cap`` 0 (TorchRec: 2 TiB). ``custom_topology_data`` gives caps per rank. On ``cpu`` the
    plan is bounded by ``ddr_cap``, on ``cuda`` by ``hbm_cap``. ``generalized_comms_bandwidths`` replaces
    ``intra_host_bw`` / ``inter_host_bw``. ``created_by_factory`` records :class:`TopologyFactory` use
    (TorchRec warns on direct construction; rectrain's Topology is a first-class constructor and does not).
    """

    world_size: int
    compute_device: str = "cpu"
    hbm_cap: int | None = None
    ddr_cap: int | None = None
    ssd_cap: int | None = None
    local_world_size: int | None = None
    pod_size: int | None = None
    hbm_mem_bw: float = HBM_MEM_BW
    ddr_mem_bw: float = DDR_MEM_BW
    ssd_mem_bw: float = SSD_MEM_BW
    hbm_to_ddr_mem_bw: float = HBM_TO_DDR_MEM_BW
    intra_host_bw: float = INTRA_HOST_BW
    inter_host_bw: float = INTER_HOST_BW
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    custom_topology_data: CustomTopologyData | None = field(default=None, repr=False)
    weighted_feature_bwd_compute_multiplier: float = WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
    uneven_sharding_perf_multiplier: float = 1.0
    generalized_comms_bandwidths: GeneralizedCommsBandwidth | None = field(default=None, repr=False)
    created_by_factory: bool = False
    devices: list[DeviceHardware] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._validate_geometry()
        if self.compute_device not in _COMPUTE_DEVICES:
            raise ConfigError(
                f"compute_device must be one of {_COMPUTE_DEVICES}, got {self.compute_device!r}"
            )
        comms = self.generalized_comms_bandwidths
        if comms is not None:
            self.intra_host_bw, self.inter_host_bw = comms.intra_host_bw, comms.inter_host_bw
        self.comms_bandwidths = comms or BasicCommsBandwidths(self.inter_host_bw, self.intra_host_bw)
        for name in ("hbm_mem_bw", "ddr_mem_bw", "intra_host_bw", "inter_host_bw", "bwd_compute_multiplier"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.hbm_cap is None:
            self.hbm_cap = _device_memory_bytes(self.compute_device) if self.compute_device != "cpu" else 0
        if self.ddr_cap is None:
            self.ddr_cap = host_memory_bytes() // self.local_world_size
        self.ssd_cap = self.ssd_cap or 0
        for name in ("hbm_cap", "ddr_cap", "ssd_cap"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative int of bytes, got {value!r}")
        caps = {k: [getattr(self, k)] * self.world_size for k in CustomTopologyData.supported_fields}
        custom = self.custom_topology_data
        caps |= {k: custom.get_data(k) for k in caps if custom and custom.has_data(k)}
        # One Storage per device: a storage reservation lowers them in place, as TorchRec's do.
        self.devices = [
            DeviceHardware(r, Storage(hbm=caps["hbm_cap"][r], ddr=caps["ddr_cap"][r], ssd=caps["ssd_cap"][r]))
            for r in range(self.world_size)
        ]
        self._created_by_factory = self.created_by_factory

    def _validate_geometry(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size <= 0:
            raise ConfigError(f"world_size must be a positive int, got {self.world_size!r}")
        if self.local_world_size is None:
            self.local_world_size = self.world_size
        if not isinstance(self.local_world_size, int) or self.local_world_size <= 0:
            raise ConfigError(f"local_world_size must be a positive int, got {self.local_world_size!r}")
        if self.pod_size and self.pod_size > self.world_size:
            raise ConfigError(f"pod_size={self.pod_size} cannot be greater than world_size={self.world_size}")
        if self.world_size < self.local_world_size:
            # A job smaller than one host (TorchRec accepts world_size=1, local_world_size=8): it runs
            # world_size ranks on that one host.
            self.local_world_size = self.world_size
        if self.world_size % self.local_world_size != 0:
            raise ConfigError(
                f"world_size ({self.world_size}) must be a multiple of local_world_size "
                f"({self.local_world_size}): every host runs the same number of ranks"
            )

    @property
    def intra_group_size(self) -> int:
        """Ranks that share the fast interconnect: ``pod_size`` hosts' ranks, or one host's."""
        return self.local_world_size * (self.pod_size or 1)

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def mem_bw(self) -> float:
        """Bytes per second of the memory the embedding rows live in (HBM on cuda, DDR on cpu)."""
        return 1000 * (self.ddr_mem_bw if self.compute_device == "cpu" else self.hbm_mem_bw)

    @property
    def comm_bw(self) -> float:
        """Bytes per second of a world-wide collective: the inter-host link once the world spans hosts."""
        return 1000 * (self.inter_host_bw if self.num_hosts > 1 else self.intra_host_bw)

    def capacity(self, rank: int) -> int:
        """Bytes a plan may use on ``rank`` (HBM on cuda, DDR on cpu)."""
        storage = self.devices[rank].storage
        return storage.ddr if self.compute_device == "cpu" else storage.hbm

    def _hash(self) -> int:
        """A hash of what shapes a plan (TorchRec's ``Topology._hash``), stable across processes."""
        storages = [[getattr(d.storage, k) for d in self.devices] for k in ("hbm", "ddr", "ssd")]
        return hash_sha256_to_int(
            [self.world_size, self.compute_device, *storages, self.local_world_size, self.intra_group_size,
             self.hbm_mem_bw, self.ddr_mem_bw, self.ssd_mem_bw, self.hbm_to_ddr_mem_bw, self.intra_host_bw,
             self.inter_host_bw, self.bwd_compute_multiplier, self.weighted_feature_bwd_compute_multiplier,
             self.uneven_sharding_perf_multiplier]
        )  # fmt: skip
