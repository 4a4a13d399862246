"""TorchRec's partitioners (``torchrec.distributed.planner.partitioners``): put a proposal's shards on ranks.

They read and write TorchRec's records: each shard carries a ``Storage`` and a ``Perf``, every device of the
storage-constraint topology a ``Storage`` it may still use, and a partition sets ``shard.rank`` in place or
raises :class:`PlannerError` (``PARTITION``).

:class:`GreedyPerfPartitioner` places the options partitioned ``uniform`` (row-wise, data-parallel: shard
``i`` on rank ``i``) first, then groups the others by ``dependency`` (an embedding tower) or table and, the
largest group first, puts ``device`` options shard by shard on the least-loaded rank with room (a min-heap on
(perf, local rank, rank)), ``host`` options (table-row-wise, table-column-wise) within the least-loaded host
that holds them, and ``multi_host`` ones (grid) on consecutive hosts. :class:`MemoryBalancedPartitioner`
bisects a per-rank HBM cap below the greedy plan's peak, keeping the leanest placement whose perf is within
``tolerance`` of the greedy one.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
from dataclasses import dataclass
from enum import Enum

from rectrain.planner.errors import PlannerError, PlannerErrorType
from rectrain.planner.protocols import Partitioner
from rectrain.planner.sharding_option import PartitionByType, Perf, ShardingOption
from rectrain.planner.topology import DeviceHardware, Storage, Topology

logger = logging.getLogger(__name__)

MB = 1024**2


def _zero_perf() -> Perf:
    return Perf(0.0, 0.0, 0.0, 0.0)


def _fail(message: str) -> PlannerError:
    return PlannerError(message, PlannerErrorType.PARTITION)


def _place(shard, device: DeviceHardware) -> None:  # noqa: ANN001
    shard.rank = device.rank
    device.storage = device.storage - shard.storage
    device.perf = (device.perf or _zero_perf()) + shard.perf


def reset_shard_rank(proposal: list[ShardingOption]) -> None:
    """Unplace every shard of ``proposal``."""
    for option in proposal:
        for shard in option.shards:
            shard.rank = None


class SortBy(Enum):
    STORAGE = "storage"
    PERF = "perf"


@dataclass
class ShardingOptionGroup:
    """Options placed together (one table, or the tables of one embedding tower)."""

    sharding_options: list[ShardingOption]
    storage_sum: Storage
    perf_sum: float
    param_count: int


@dataclass
class OrderedDeviceHardware:
    """A device in the partitioner's min-heap: least perf first, then lowest local rank (spreading load
    over hosts' memory), then lowest rank."""

    device: DeviceHardware
    local_world_size: int

    def key(self) -> tuple[float, int, int]:
        perf = self.device.perf.total if self.device.perf is not None else 0.0
        return (perf, self.device.rank % self.local_world_size, self.device.rank)

    def __lt__(self, other: OrderedDeviceHardware) -> bool:
        return self.key() < other.key()


def _groups(
    options: list[ShardingOption], sort_by: SortBy, balance_modules: bool
) -> list[ShardingOptionGroup]:
    """The non-uniform options grouped by dependency (else table), largest first (by ``sort_by``; with
    ``balance_modules``, modules with fewer tables first)."""
    tables_per_module: dict[str, int] = {}
    for option in options:
        tables_per_module[option.path] = tables_per_module.get(option.path, 0) + 1
    groups: dict[str, ShardingOptionGroup] = {}
    for option in options:
        if option.partition_by == PartitionByType.UNIFORM.value:
            continue
        key = option.dependency or option.fqn
        if key not in groups:
            groups[key] = ShardingOptionGroup([], Storage(0, 0), 0.0, -tables_per_module[option.path])
        group = groups[key]
        group.sharding_options.append(option)
        group.storage_sum += option.total_storage
        group.perf_sum += option.total_perf

    def size(group: ShardingOptionGroup) -> tuple:
        s = group.storage_sum
        measure = (s.hbm, s.ddr, s.ssd) if sort_by == SortBy.STORAGE else (group.perf_sum,)
        return ((group.param_count,) if balance_modules else ()) + measure

    return sorted(groups.values(), key=size, reverse=True)


class GreedyPerfPartitioner(Partitioner):
    """Greedy placement, largest groups first (module doc). ``sort_by``: what "largest" means;
    ``balance_modules``: place the tables of smaller modules first."""

    def __init__(self, sort_by: SortBy = SortBy.STORAGE, balance_modules: bool = False) -> None:
        self._sort_by = sort_by
        self._balance_modules = balance_modules

    def partition(
        self, proposal: list[ShardingOption], storage_constraint: Topology, hbm_per_device: int | None = None
    ) -> list[ShardingOption]:
        """Set every shard's rank of ``proposal`` (returned); ``hbm_per_device`` caps each rank's HBM."""
        devices = [
            DeviceHardware(
                d.rank,
                Storage(hbm_per_device or d.storage.hbm, d.storage.ddr, d.storage.ssd),
                copy.deepcopy(d.perf) if d.perf is not None else _zero_perf(),
            )
            for d in storage_constraint.devices
        ]
        per_host = storage_constraint.intra_group_size
        hosts = [devices[i : i + per_host] for i in range(0, len(devices), per_host)]
        uniform = [o for o in proposal if o.partition_by == PartitionByType.UNIFORM.value]
        self._uniform_partition(uniform, devices)
        heap: list[OrderedDeviceHardware] | None = None
        for group in _groups(proposal, self._sort_by, self._balance_modules):
            partition_by = group.sharding_options[0].partition_by
            if partition_by == PartitionByType.MULTI_HOST.value:
                self._multi_hosts_partition(group, hosts)
                heap = None  # device loads changed under the heap
            elif partition_by == PartitionByType.HOST.value:
                self._cohost_partition(group, hosts)
                heap = None
            elif partition_by == PartitionByType.DEVICE.value:
                if heap is None:
                    heap = self._establish_minheap(devices, storage_constraint.local_world_size)
                (option,) = group.sharding_options
                if option.sharding_type == "column_wise" and option.compute_kernel == "key_value":
                    self._column_wise_device_partition(option, heap)
                else:
                    self._device_partition(option, heap)
            else:
                raise _fail(f"unexpected partition_by {partition_by!r} of {group.sharding_options[0].fqn}")
        return proposal

    @classmethod
    def _establish_minheap(
        cls, devices: list[DeviceHardware], local_world_size: int
    ) -> list[OrderedDeviceHardware]:
        heap = [OrderedDeviceHardware(d, local_world_size) for d in devices]
        heapq.heapify(heap)
        return heap

    @classmethod
    def _device_partition(
        cls, option: ShardingOption, heap: list[OrderedDeviceHardware], bulk_heapify_threshold: float = 0.25
    ) -> None:
        """Each shard onto the least-loaded device with room; the heap stays a heap."""
        push_limit = len(heap) * bulk_heapify_threshold  # above it, one heapify beats many pushes
        for shard in option.shards:
            skipped = []
            while heap and not shard.storage.fits_in(heap[0].device.storage):
                skipped.append(heapq.heappop(heap))
            if not heap:
                heap.extend(skipped)
                heapq.heapify(heap)
                raise _fail(
                    f"Device partition failed. Couldn't find a rank for shard {shard} of table {option.name}"
                )
            _place(shard, heap[0].device)
            heapq.heapreplace(heap, heap[0])
            if len(skipped) <= push_limit:
                for entry in skipped:
                    heapq.heappush(heap, entry)
            else:
                heap.extend(skipped)
                heapq.heapify(heap)

    @classmethod
    def _column_wise_device_partition(cls, option: ShardingOption, heap: list[OrderedDeviceHardware]) -> None:
        """Column shards of a key-value table each on a different rank, least loaded first."""
        if option.num_shards > len(heap):
            raise _fail(
                f"COLUMN_WISE sharding requires num_shards ({option.num_shards}) <= num_devices ({len(heap)})"
            )
        used: set[int] = set()
        for shard in option.shards:
            free = sorted((e for e in heap if e.device.rank not in used), key=OrderedDeviceHardware.key)
            device = next((e.device for e in free if shard.storage.fits_in(e.device.storage)), None)
            if device is None:
                raise _fail(f"COLUMN_WISE partition failed. No rank for shard {shard} of table {option.name}")
            _place(shard, device)
            used.add(device.rank)
        heapq.heapify(heap)

    @staticmethod
    def _uniform_partition(options: list[ShardingOption], devices: list[DeviceHardware]) -> None:
        """Shard ``i`` of each option on ``devices[i]``."""
        for option in options:
            if option.num_shards != len(devices):
                raise _fail(
                    f"For a uniform partition, the number of shards ({option.num_shards}) must equal the "
                    f"number of devices ({len(devices)})"
                )
            for shard, device in zip(option.shards, devices):
                if not shard.storage.fits_in(device.storage):
                    raise _fail(
                        f"Shard of size {shard.storage} bytes does not fit on any rank. Device memory cap: "
                        f"{device.storage}."
                    )
                _place(shard, device)

    @staticmethod
    def _host_perf(host: list[DeviceHardware]) -> float:
        return sum(d.perf.total for d in host if d.perf is not None)

    @classmethod
    def _cohost_partition(cls, group: ShardingOptionGroup, hosts: list[list[DeviceHardware]]) -> None:
        """The group on the least-loaded host that holds it all (tried on copies, committed on success)."""
        for host in sorted(hosts, key=cls._host_perf):
            trial = copy.deepcopy(host)
            room = Storage(0, 0)
            for device in trial:
                room += device.storage
            if not group.storage_sum.fits_in(room):
                continue
            heap = None
            try:
                for option in group.sharding_options:
                    if option.sharding_type == "table_row_wise":
                        cls._uniform_partition([option], trial)
                        heap = None
                    elif option.sharding_type == "table_column_wise":
                        heap = heap or cls._establish_minheap(trial, len(trial))
                        cls._device_partition(option, heap)
                    else:
                        raise _fail(f"unexpected cohost sharding type: {option.sharding_type}")
            except PlannerError:
                continue
            for device, placed in zip(host, sorted(trial, key=lambda d: d.rank)):
                device.storage, device.perf = placed.storage, placed.perf
            return
        raise _fail(f"can't find a host for sharding option group of {group.sharding_options[0].fqn}")

    @classmethod
    def _multi_hosts_partition(cls, group: ShardingOptionGroup, hosts: list[list[DeviceHardware]]) -> None:
        """A grid-sharded table uniformly over consecutive hosts (least loaded first; all hosts, cycling,
        when it needs at least as many hosts as there are)."""
        if len(group.sharding_options) != 1:
            raise _fail(
                f"Unexpected length for sharding options: {len(group.sharding_options)}. Length needs to be 1"
            )
        (option,) = group.sharding_options
        needed, remainder = divmod(option.num_shards, len(hosts[0]))
        if remainder:
            raise _fail(
                "Grid Sharding is unable to place shards equally over hosts without overlapping. "
                f"num_shards={option.num_shards} % local_world_size={len(hosts[0])} != 0"
            )
        ordered = sorted(hosts, key=cls._host_perf)
        if needed >= len(ordered):
            windows = [[ordered[i % len(ordered)] for i in range(needed)]]
        else:
            windows = [ordered[i : i + needed] for i in range(len(ordered) - needed + 1)]
        for window in windows:
            devices = list(itertools.chain(*window))
            trial = copy.deepcopy(devices)
            try:
                if option.sharding_type != "grid_shard":
                    raise _fail(f"unexpected multi_host sharding type: {option.sharding_type}")
                cls._uniform_partition([option], trial)
            except PlannerError:
                continue
            for device, placed in zip(devices, trial):
                device.storage, device.perf = placed.storage, placed.perf
            return
        raise _fail(f"can't find hosts for sharding option group of {option.fqn}")


def _rate(plan: list[ShardingOption], world_size: int) -> float:
    """The busiest rank's perf (TorchRec's ``NoopPerfModel``)."""
    perfs = [0.0] * world_size
    for option in plan:
        for shard in option.shards:
            perfs[shard.rank] += shard.perf.total
    return max(perfs)


class MemoryBalancedPartitioner(Partitioner):
    """The greedy plan (by perf), then a bisection of a per-rank HBM cap between the average need (or the
    largest shard) and the greedy plan's peak: the lowest cap whose plan is within ``tolerance`` of the
    greedy plan's perf wins; at most ``max_search_count`` tries, stopping within 10 MB."""

    def __init__(
        self, max_search_count: int = 10, tolerance: float = 0.02, balance_modules: bool = False
    ) -> None:
        self._max_search_count = max_search_count
        self._tolerance = tolerance
        self._balance_modules = balance_modules

    def partition(self, proposal: list[ShardingOption], storage_constraint: Topology) -> list[ShardingOption]:
        greedy = GreedyPerfPartitioner(sort_by=SortBy.PERF, balance_modules=self._balance_modules)
        world = storage_constraint.world_size
        plan = greedy.partition(proposal, storage_constraint)
        best = [o.get_shards_assignment() for o in plan]
        perf = _rate(plan, world)
        hbm = [0] * world
        for shard in (s for o in plan for s in o.shards):
            hbm[shard.rank] += shard.storage.hbm
        high = max(hbm)
        low = max(sum(hbm) // world, max((s.storage.hbm for o in plan for s in o.shards), default=0))
        for _ in range(self._max_search_count):
            if low + 10 * MB >= high:
                break
            reset_shard_rank(proposal)
            cap = (high + low) // 2
            try:
                trial = greedy.partition(proposal, storage_constraint, cap)
            except PlannerError:
                low = cap
                continue
            if _rate(trial, world) > perf * (1 + self._tolerance):
                low = cap
            else:
                best, high = [o.get_shards_assignment() for o in trial], cap
        for option, ranks in zip(plan, best):
            for shard, rank in zip(option.shards, ranks):
                shard.rank = rank
        return plan
