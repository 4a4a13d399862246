"""TorchRec's planner records: a :class:`ShardingOption` (one way to shard one table of one module) and its
:class:`Shard` s (``torchrec.distributed.planner.types``).

These are what TorchRec's enumerator API hands to estimators, proposers and partitioners; they refer to the
module and its table weight (usually on the meta device) rather than to a table config, as TorchRec's do.
rectrain's own planner (``rectrain.planner``) plans from table configs with its own records.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import nn

from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.planner.topology import Storage
from rectrain.zch.embedding import ManagedCollisionEmbeddingCollection


@dataclass
class Perf:
    """Estimated milliseconds one shard costs its rank per iteration, by stage (TorchRec's ``Perf``)."""

    fwd_compute: float
    fwd_comms: float
    bwd_compute: float
    bwd_comms: float
    prefetch_compute: float = 0.0
    input_dist_comms: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.fwd_compute
            + self.fwd_comms
            + self.bwd_compute
            + self.bwd_comms
            + self.prefetch_compute
            + self.input_dist_comms
        )

    def __hash__(self) -> int:
        return hash(
            (
                self.fwd_compute,
                self.fwd_comms,
                self.bwd_compute,
                self.bwd_comms,
                self.prefetch_compute,
                self.input_dist_comms,
            )
        )


@dataclass
class Shard:
    """A block of a table: ``size`` ``[rows, cols]`` at ``offset`` ``[row, col]``, with the estimates of what
    it needs (``storage``) and costs (``perf``) and, once placed, its ``rank``."""

    size: list[int]
    offset: list[int]
    storage: Storage | None = None
    perf: Perf | None = None
    rank: int | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.size), tuple(self.offset), self.storage, self.perf, self.rank))

    def __str__(self) -> str:
        return (
            f"Shard size: {tuple(self.size)}, offset: {tuple(self.offset)}, storage: {self.storage}, "
            f"perf: {self.perf}, rank: {self.rank}"
        )


class PartitionByType(Enum):
    """How a partitioner places an option's shards: each on any device, all within one host, one per
    rank in order, or across hosts."""

    DEVICE = "device"
    HOST = "host"
    UNIFORM = "uniform"
    MULTI_HOST = "multi_host"


class ShardingOption:
    """One way to shard the table ``name`` of ``module`` (``(path, module)``): its sharding type, compute
    kernel and shards, with the workload the estimators read (``input_lengths``: pooling factor per feature,
    ``batch_size``). ``dependency`` names the embedding tower the table must stay with, if any."""

    def __init__(
        self,
        name: str,
        tensor: torch.Tensor,
        module: tuple[str, nn.Module],
        input_lengths: list[float],
        batch_size: int,
        sharding_type: str,
        partition_by: str,
        compute_kernel: str,
        shards: list[Shard],
        cache_params: Any = None,
        enforce_hbm: bool | None = None,
        stochastic_rounding: bool | None = None,
        bounds_check_mode: Any = None,
        dependency: str | None = None,
        is_pooled: bool | None = None,
        feature_names: list[str] | None = None,
        output_dtype: Any = None,
        key_value_params: Any = None,
        num_poolings: list[float] | None = None,
    ) -> None:
        self.name = name
        self._tensor = tensor
        self._module = module
        self.input_lengths = input_lengths
        self.batch_size = batch_size
        self.sharding_type = sharding_type
        self.partition_by = partition_by
        self.compute_kernel = compute_kernel
        self.shards = shards
        self.cache_params = cache_params
        self.enforce_hbm = enforce_hbm
        self.stochastic_rounding = stochastic_rounding
        self.bounds_check_mode = bounds_check_mode
        self.dependency = dependency
        self._is_pooled = is_pooled if is_pooled is not None else self.module_pooled(module[1], name)
        self.feature_names = feature_names
        self.output_dtype = output_dtype
        self.key_value_params = key_value_params
        self.num_poolings = num_poolings
        child = module[1]
        self._module_type_key = f"{type(child).__module__}.{type(child).__name__}"
        is_weighted = getattr(child, "is_weighted", None)
        self.is_weighted: bool | None = is_weighted() if callable(is_weighted) else None

    @property
    def tensor(self) -> torch.Tensor:
        return self._tensor

    @property
    def module(self) -> tuple[str, nn.Module]:
        return self._module

    @property
    def path(self) -> str:
        return self._module[0]

    @property
    def fqn(self) -> str:
        return f"{self._module[0]}.{self.name}"

    @property
    def module_type_key(self) -> str:
        """``module.qualname`` of the module's type: the key of its sharder."""
        return self._module_type_key

    @property
    def cache_load_factor(self) -> float | None:
        return getattr(self.cache_params, "load_factor", None)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_inputs(self) -> int:
        return len(self.input_lengths)

    @property
    def is_pooled(self) -> bool:
        return self._is_pooled

    @property
    def total_storage(self) -> Storage:
        total = Storage(hbm=0, ddr=0)
        for shard in self.shards:
            assert shard.storage is not None, f"{self.fqn}: storage is estimated before it is summed"
            total += shard.storage
        return total

    @property
    def total_perf(self) -> float:
        return sum(shard.perf.total for shard in self.shards if shard.perf is not None)

    @staticmethod
    def module_pooled(module: nn.Module, sharding_option_name: str) -> bool:
        """False when the table is looked up unpooled (by an ``EmbeddingCollection``, possibly nested)."""
        unpooled = (EmbeddingCollection, ManagedCollisionEmbeddingCollection)
        if isinstance(module, unpooled):
            return False
        for sub in module.modules():
            if isinstance(sub, unpooled) and any(
                sharding_option_name in n for n, _ in sub.named_parameters()
            ):
                return False
        return True

    def get_shards_assignment(self) -> list[int | None]:
        return [shard.rank for shard in self.shards]

    def __hash__(self) -> int:
        return hash(
            (self.fqn, self.sharding_type, self.compute_kernel, tuple(self.shards), self.cache_params)
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> ShardingOption:
        # The table weight and the module are shared, never copied: options only describe them.
        result = type(self).__new__(type(self))
        for key, value in self.__dict__.items():
            shared = key in ("_tensor", "_module")
            setattr(result, key, value if shared else copy.deepcopy(value, memo))
        return result

    def __str__(self) -> str:
        lines = [
            f"name: {self.name}",
            f"sharding type: {self.sharding_type}",
            f"compute kernel: {self.compute_kernel}",
            f"num shards: {len(self.shards)}",
        ]
        return "\n".join(lines + [f"\t{shard}" for shard in self.shards])
