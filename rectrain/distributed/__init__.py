"""Distributed training: process-group setup and the collectives the sharding code is written in."""

from rectrain.distributed.comm import (
    all_gather_v,
    all_reduce_coalesced,
    all_to_all_single,
    all_to_all_with_splits,
    alltoall_pooled,
    exchange_splits,
    reduce_scatter_v_pooled,
)
from rectrain.distributed.env import ShardingEnv, default_backend, init_from_env, intra_and_cross_node_pg
from rectrain.distributed.pending import Pending

__all__ = [
    "Pending",
    "ShardingEnv",
    "all_gather_v",
    "all_reduce_coalesced",
    "all_to_all_single",
    "all_to_all_with_splits",
    "alltoall_pooled",
    "default_backend",
    "exchange_splits",
    "init_from_env",
    "intra_and_cross_node_pg",
    "reduce_scatter_v_pooled",
]
