"""A hash of what a plan is made from (TorchRec's ``hash_planner_context_inputs``), equal on every process
and machine for the same inputs: a stored plan is reused only where its inputs hash the same.

Memory capacities are rounded to the nearest ``HUNDRED_GB`` before hashing, so two hosts whose drivers
report a few bytes apart hash the same, while a real difference in capacity does not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

HUNDRED_GB = 100 * 1024**3


def hash_sha256_str(hashable_list: list[Any]) -> str:
    """The sha256 hex digest of the list's ``str``."""
    return hashlib.sha256(str(hashable_list).encode("utf-8")).hexdigest()


def hash_sha256_to_int(hashable_list: list[Any]) -> int:
    return int(hash_sha256_str(hashable_list), 16)


def round_to_nearest(x: int, unit: int) -> int:
    return round(x / unit) * unit


def _topology_components(topology: Any, unit: int = HUNDRED_GB) -> list[Any]:
    devices = [
        (d.rank, *(round_to_nearest(getattr(d.storage, k), unit) for k in ("hbm", "ddr", "ssd")))
        for d in topology.devices
    ]
    comms = topology.comms_bandwidths
    return [
        topology.world_size, topology.compute_device, devices, topology.local_world_size,
        topology.intra_group_size, topology.hbm_mem_bw, topology.ddr_mem_bw, topology.ssd_mem_bw,
        topology.hbm_to_ddr_mem_bw, comms.intra_host_bw, comms.inter_host_bw, topology.bwd_compute_multiplier,
        topology.weighted_feature_bwd_compute_multiplier, topology.uneven_sharding_perf_multiplier,
    ]  # fmt: skip


def _shard_components(shard: Any) -> tuple:
    storage = shard.storage
    return (
        tuple(shard.size),
        tuple(shard.offset),
        shard.rank,
        (storage.hbm, storage.ddr, storage.ssd) if storage else None,
    )


def _hashable_list(
    topology: Any, batch_size: int, enumerator: Any, storage_reservation: Any, constraints: dict | None
) -> list[Any]:
    search_space = getattr(enumerator, "last_stored_search_space", None)
    if search_space is None:
        raise ValueError("hashing a planner's context needs an enumerator that has enumerated a search space")
    # No reservation hashes as such; a reservation must have reserved (its topology is what planning saw).
    reserved = storage_reservation and storage_reservation.last_reserved_topology
    if storage_reservation is not None and reserved is None:
        raise ValueError("hashing a planner's context needs a storage reservation that has reserved")
    options = [
        [o.fqn, o.sharding_type, o.compute_kernel, tuple(map(_shard_components, o.shards)), o.cache_params]
        for o in search_space
    ]
    return [
        hash_sha256_to_int(_topology_components(topology)),
        batch_size,
        options,
        type(storage_reservation).__name__,
        hash_sha256_to_int(_topology_components(reserved)) if reserved else None,
        tuple((k, hash(v)) for k, v in sorted(constraints.items())) if constraints else None,
    ]


def hash_planner_context_inputs(
    topology: Any,
    batch_size: int,
    enumerator: Any,
    storage_reservation: Any,
    constraints: dict | None,
    hash_function: Callable[[list[Any]], int] = hash_sha256_to_int,
) -> int:
    """A hash of the topology, batch size, enumerated search space, reserved topology and constraints."""
    return hash_function(_hashable_list(topology, batch_size, enumerator, storage_reservation, constraints))


def hash_planner_context_inputs_str(
    topology: Any,
    batch_size: int,
    enumerator: Any,
    storage_reservation: Any,
    constraints: dict | None,
    hash_function: Callable[[list[Any]], str] = hash_sha256_str,
) -> str:
    """:func:`hash_planner_context_inputs` as a hex string."""
    return hash_function(_hashable_list(topology, batch_size, enumerator, storage_reservation, constraints))
