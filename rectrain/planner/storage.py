"""Estimate the bytes each shard occupies on its rank.

bytes = weights (rows x cols x element bytes)
      + optimizer state (``FusedOptimizerConfig.state_floats_per_row(cols)`` fp32 values per row)
      + a dense gradient (rows x cols x 4) for the ``dense`` kernel, which materialises it
      + id buffer and output buffer of one iteration (see :mod:`rectrain.planner.workload`).
A data-parallel table is replicated, so this full size lands on every rank.
"""

from __future__ import annotations

import math

from rectrain.embedding.config import FusedOptimizerConfig
from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.topology import Topology
from rectrain.planner.types import FP32_BYTES, EmbeddingComputeKernel, Shard
from rectrain.planner.workload import shard_workload


def element_bytes(option: ShardingOption) -> float:
    """Bytes of one stored weight (fractional for sub-byte types)."""
    if option.table is None:  # enumerated from a module: its weight's dtype
        return option.tensor.element_size()
    return option.table.data_type.bits / 8


def shard_parameter_bytes(option: ShardingOption, shard: Shard, optimizer: FusedOptimizerConfig) -> int:
    """Weights plus optimizer state (plus the dense gradient) of ``shard``: what stays resident."""
    weights = shard.num_rows * shard.num_cols * element_bytes(option)
    state = shard.num_rows * optimizer.state_floats_per_row(shard.num_cols) * FP32_BYTES
    grad = 0
    if option.compute_kernel == EmbeddingComputeKernel.DENSE:
        grad = shard.num_rows * shard.num_cols * FP32_BYTES
    return math.ceil(weights + state + grad)


def estimate_storage(
    option: ShardingOption, topology: Topology, optimizer: FusedOptimizerConfig
) -> list[int]:
    """Bytes of every shard of ``option`` on its rank, in shard order."""
    result = []
    for shard in option.shards:
        work = shard_workload(option, shard, topology)
        buffers = math.ceil(work.id_bytes + work.output_bytes)
        result.append(shard_parameter_bytes(option, shard, optimizer) + buffers)
    return result
