"""TorchRec's 2D-parallel configuration (``DMPCollection``: a model sharded over groups of
``sharding_group_size`` ranks and replicated across the groups).

rectrain shards a model over the one world of ``DistributedModelParallel`` (``DMPCollection``: refused);
these are TorchRec's configuration types only, so code that builds them imports and compares them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from torch import nn

from rectrain.distributed.interfaces.sharded_module import ShardedModule


class ShardingStrategy(Enum):
    DEFAULT = "default"
    PER_MODULE = "per_module"
    FULLY_SHARDED = "fully_sharded"


@dataclass
class DMPCollectionConfig:
    """The sharding of one module type under 2D parallelism (``module`` is a class, not a sharded module)."""

    module: type[nn.Module]
    plan: Any = field(repr=False)
    sharding_group_size: int
    node_group_size: int | None = None
    use_inter_host_allreduce: bool = False
    sharding_strategy: ShardingStrategy = ShardingStrategy.DEFAULT

    def __post_init__(self) -> None:
        if isinstance(self.module, ShardedModule):
            raise ValueError(
                f"ShardedModule should not be passed into DMPCollectionConfig: got {type(self.module)}"
            )


@dataclass(eq=False)
class DMPCollectionContext(DMPCollectionConfig):
    """``DMPCollectionConfig`` with a collection's runtime state (groups, modules to sync); compares as its
    configuration."""

    modules_to_sync: list[tuple[nn.Module, nn.Module]] = field(default_factory=list, repr=False)
    sharded_module: nn.Module | None = field(default=None, repr=False)
    device_mesh: Any = field(default=None, repr=False)
    sharding_pg: Any = field(default=None, repr=False)
    replica_pg: Any = field(default=None, repr=False)
    weights_by_dtype: dict[Any, list[Any]] = field(default_factory=dict, repr=False)
    optimizer_tensors_by_dtype: dict[Any, list[Any]] = field(default_factory=dict, repr=False)
    hash_zch_modules: list[tuple[nn.Module, str]] = field(default_factory=list, repr=False)
