"""What a training rank keeps resident, estimated from a plan before anything is allocated.

    rank bytes = PROCESS_BYTES                     interpreter, torch, FBGEMM, numba, data pipeline (measured)
               + per shard on the rank: weights + fused optimizer state + the CPU backward's per-row
                 counter (int32) + one iteration's ids, outputs and output gradients
               + the dense part: parameters x 4 (weights, gradients, optimizer state, DDP buckets)

A data-parallel table is whole on every rank. ``PROCESS_BYTES`` was measured on a 2-core AVX-512 machine
(torch 2.13 CPU, fbgemm-gpu-cpu 1.8): a ``rectrain train`` rank of a model with 2 GB of shards peaked
0.49 GB above its tables and optimizer state (``bench/memory_scale.py``). ``DistributedModelParallel``
checks the estimate of every rank against the memory that rank may use before it allocates a shard
(``check_fits``), so a plan too large for the machine fails at once, naming the rank and the numbers,
instead of after minutes of initialisation or in the kernel's out-of-memory killer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rectrain.embedding.config import BaseEmbeddingConfig, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.planner.plan import ShardingPlan
from rectrain.planner.types import FP32_BYTES, GB, ID_BYTES, ShardingType

PROCESS_BYTES = 490 * 10**6
_COUNTER_BYTES = 4  # the CPU backward's per-row counter (rectrain.embedding.cpu_kernel)


@dataclass
class RankMemory:
    """One rank's estimated resident bytes, by what holds them."""

    rank: int
    tables: int = 0
    optimizer: int = 0
    working: int = 0
    dense: int = 0

    @property
    def total(self) -> int:
        return PROCESS_BYTES + self.tables + self.optimizer + self.working + self.dense

    def describe(self) -> str:
        parts = (
            f"tables {self.tables / GB:.2f}, optimizer state {self.optimizer / GB:.2f}, working "
            f"{self.working / GB:.2f}, dense part {self.dense / GB:.2f}, process {PROCESS_BYTES / GB:.2f}"
        )
        return f"{self.total / GB:.2f} GB ({parts})"


def rank_memory(
    plan: ShardingPlan,
    tables: Mapping[str, Sequence[BaseEmbeddingConfig]],
    optimizer: FusedOptimizerConfig | None,
    batch_size: int,
    dense_parameter_bytes: int = 0,
) -> list[RankMemory]:
    """Every rank's estimate for ``plan`` over ``tables`` (``{module path: configs}``); ``optimizer`` None is
    what sharded tables given none train with, as in TorchRec: FBGEMM's exact SGD, which keeps no state."""
    world = plan.world_size
    ranks = [RankMemory(r, dense=4 * dense_parameter_bytes) for r in range(world)]
    for path, configs in tables.items():
        module_plan = plan.get_plan_for_module(path) or {}
        for table in configs:
            sharding = module_plan.get(table.name)
            if sharding is None:
                continue
            element = table.data_type.bits / 8
            if sharding.sharding_type is ShardingType.DATA_PARALLEL:
                pieces = [(r, table.num_embeddings, table.embedding_dim) for r in range(world)]
            else:
                pieces = [(s.rank, s.num_rows, s.num_cols) for s in sharding.sharding_spec or []]
            for rank, rows, cols in pieces:
                memory = ranks[rank]
                memory.tables += int(rows * cols * element)
                state = 0 if optimizer is None else optimizer.state_floats_per_row(cols)
                memory.optimizer += rows * state * FP32_BYTES
                # The global batch's ids of the table's features arrive here; 3 pooled buffers go back.
                examples = batch_size * world * table.num_features
                memory.working += rows * _COUNTER_BYTES + examples * (ID_BYTES + 3 * cols * FP32_BYTES)
    return ranks


def check_fits(memory: Sequence[RankMemory], capacity: Sequence[int], where: str) -> None:
    """ConfigError naming the first rank whose estimate exceeds its capacity, with both numbers."""
    for estimate, cap in zip(memory, capacity):
        if estimate.total > cap:
            raise ConfigError(
                f"{where}: rank {estimate.rank} would need {estimate.describe()} but may use "
                f"{cap / GB:.2f} GB; shard over more ranks, or set planner.ddr_cap_gb if the machine has more"
            )
