"""The planner's record of one way to shard one table: TorchRec's :class:`ShardingOption` (and its
:class:`Perf` and :class:`PartitionByType`, ``torchrec.distributed.planner.types``).

An option refers to its module and table weight (usually on the meta device), as TorchRec's does; rectrain's
planner, which plans from table configs, builds options with :meth:`ShardingOption.for_table` (the table's
config in ``table``, a meta weight, and per-feature ``batch_sizes``). Its shards are :class:`Shard` s.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import nn

from rectrain.embedding.config import BaseEmbeddingConfig, EmbeddingBagConfig
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.planner.topology import Storage
from rectrain.planner.types import Shard
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

    def __add__(self, other: Perf) -> Perf:
        return Perf(*(getattr(self, f) + getattr(other, f) for f in _PERF_FIELDS))

    def scaled(self, factor: float) -> Perf:
        return Perf(*(getattr(self, f) * factor for f in _PERF_FIELDS))

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


_PERF_FIELDS = (
    "fwd_compute",
    "fwd_comms",
    "bwd_compute",
    "bwd_comms",
    "prefetch_compute",
    "input_dist_comms",
)


# What an option carries from its table's ParameterConstraints (into the plan's ParameterSharding).
_FROM_CONSTRAINTS = (
    "cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "feature_names",
    "output_dtype", "key_value_params",
)  # fmt: skip


class PartitionByType(Enum):
    """How a partitioner places an option's shards: each on any device, all within one host, one per
    rank in order, or across hosts."""

    DEVICE = "device"
    HOST = "host"
    UNIFORM = "uniform"
    MULTI_HOST = "multi_host"


_PARTITION_BY = {
    "table_wise": PartitionByType.DEVICE,
    "column_wise": PartitionByType.DEVICE,
    "table_row_wise": PartitionByType.HOST,
    "table_column_wise": PartitionByType.HOST,
    "row_wise": PartitionByType.UNIFORM,
    "data_parallel": PartitionByType.UNIFORM,
    "grid_shard": PartitionByType.MULTI_HOST,
}


def get_partition_by_type(sharding_type: str) -> str:
    """How a partitioner places the shards of ``sharding_type`` (a ``PartitionByType`` value)."""
    try:
        return _PARTITION_BY[str(sharding_type)].value
    except KeyError:
        raise ValueError(f"unrecognized or unsupported sharding type {sharding_type!r}") from None


class ShardingOption:
    """One way to shard the table ``name`` of ``module`` (``(path, module)``): its sharding type, compute
    kernel and shards, with the workload the estimators read (``input_lengths``: pooling factor per feature,
    ``batch_size``, or ``batch_sizes`` per feature). ``dependency`` names the embedding tower the table must
    stay with, if any. ``table``: the table's config, when the option was made from one (``for_table``)."""

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
        table: BaseEmbeddingConfig | None = None,
        batch_sizes: list[int] | None = None,
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
        if is_pooled is None and module[1] is None:
            # Planned from table configs (``for_table``), not a module: the table's kind says (None: unknown).
            is_pooled = isinstance(table, EmbeddingBagConfig) if table is not None else None
        elif is_pooled is None:
            is_pooled = self.module_pooled(module[1], name)
        self._is_pooled = is_pooled
        self.feature_names = feature_names
        self.output_dtype = output_dtype
        self.key_value_params = key_value_params
        self.num_poolings = num_poolings
        self.table, self.batch_sizes = table, batch_sizes
        child = module[1]
        self._module_type_key = f"{type(child).__module__}.{type(child).__name__}"
        is_weighted = getattr(child, "is_weighted", None)
        self.is_weighted: bool | None = is_weighted() if callable(is_weighted) else None

    @classmethod
    def for_table(
        cls,
        module_path: str,
        table: BaseEmbeddingConfig,
        sharding_type: str,
        compute_kernel: str,
        shards: list[Shard],
        features: list[tuple[int, float]],
        constraint: Any = None,
    ) -> ShardingOption:
        """An option of the table ``table`` of the module at ``module_path`` (``features``: ``(batch size,
        pooling factor)`` per feature), as rectrain's planner enumerates them from table configs; the
        table's ``ParameterConstraints`` give the kernel options it carries (TorchRec's fields)."""
        dtype = {32: torch.float32, 16: torch.float16}.get(table.data_type.bits, torch.uint8)
        weight = torch.empty(table.num_embeddings, table.embedding_dim, device="meta", dtype=dtype)
        batch_sizes, input_lengths = [b for b, _ in features], [p for _, p in features]
        option = cls(
            table.name, weight, (module_path, None), input_lengths, batch_sizes[0], sharding_type,
            get_partition_by_type(sharding_type), compute_kernel, shards,
            is_pooled=isinstance(table, EmbeddingBagConfig), table=table, batch_sizes=batch_sizes,
            **{name: getattr(constraint, name) for name in _FROM_CONSTRAINTS if constraint is not None},
        )  # fmt: skip
        if constraint is not None:
            option.is_weighted = constraint.is_weighted
        return option

    @property
    def features(self) -> list[tuple[int, float]]:
        """``(batch size, pooling factor)`` of every feature."""
        return list(zip(self.batch_sizes or [self.batch_size] * self.num_inputs, self.input_lengths))

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

    def with_shards(self, shards: list[Shard]) -> ShardingOption:
        """This option with other ``shards`` (everything else shared, not copied)."""
        result = copy.copy(self)
        result.shards = shards
        return result

    def storage_hash(self) -> int:
        """A hash of what the option is before planning (table, type, kernel, cache load factor, shard
        count), stable across processes: the key of a stored plan's options (TorchRec's)."""
        key = f"{self.fqn}|{self.sharding_type}|{self.compute_kernel}|{self.cache_load_factor}"
        key += f"|{self.num_shards}"
        return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=7).digest(), "big")

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
