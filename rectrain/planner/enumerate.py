"""Every legal way to shard each table (shapes only; ranks are chosen by the partitioner): one enumerator,
two entry points over one set of shard shapes (``rectrain.planner.shard_shapes``).

- ``enumerate_tables(tables, constraints, offered)``: what rectrain's planner plans from table configs. Only
  the sharding types and kernels rectrain runs; data parallel takes the dense kernel (its gradient is
  all-reduced), every other type the fused one; column-wise options at several widths
  (``CW_SHARD_DIMS``); table row wise on a single host only when asked for (it is row wise there).
- ``enumerate(module, sharders)``: TorchRec's API. Walks the module, and for every module one of
  ``sharders`` shards (matched by module type) lists every table's options: the sharding types the sharder
  offers on the topology's device, narrowed by the table's constraints, times the kernels it offers for
  each, narrowed the same way; shards by ``calculate_shard_sizes_and_offsets``, then the estimators fill in
  each shard's needs (default: TorchRec's storage rule, ``EmbeddingStorageEstimator``). TorchRec's filtering
  rules: without constraints ``grid_shard`` is never offered, row-based types are not offered for
  feature-processed collections, and the key-value kernels are not offered; ``dense`` is dropped where
  ``fused`` is also allowed. Options may name types and kernels rectrain does not run when a sharder offers
  them (rectrain's own sharders offer only those it runs); a plan that uses one is refused.

A table left with no option is an error naming it and why.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any

from torch import nn

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.errors import ConfigError
from rectrain.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
from rectrain.planner.constraints import POOLING_FACTOR, ParameterConstraints
from rectrain.planner.perf import EmbeddingPerfEstimator
from rectrain.planner.shard_estimators import EmbeddingStorageEstimator
from rectrain.planner.shard_shapes import (
    CW_SHARD_DIMS,
    calculate_shard_sizes_and_offsets,
    column_blocks,
    row_blocks,
)
from rectrain.planner.sharder_data import build_sharder_data_map, sharder_name
from rectrain.planner.sharding_option import ShardingOption, get_partition_by_type
from rectrain.planner.topology import Topology
from rectrain.planner.types import (
    PLANNED_SHARDING_TYPES,
    RUNNABLE_KERNELS,
    EmbeddingComputeKernel,
    Shard,
    ShardingType,
)

logger = logging.getLogger(__name__)

_K = EmbeddingComputeKernel
# Kernels offered only when a table's constraints name them (they change what a table is).
GUARDED_COMPUTE_KERNELS = {
    _K.KEY_VALUE,
    _K.SSD_VIRTUAL_TABLE,
    _K.DRAM_VIRTUAL_TABLE,
    _K.DRAM_SSD_VIRTUAL_TABLE,
}
# Sharding types a feature-processed collection gets only when its constraints name them: they process
# features after the input dist, a path TorchRec guards (position weights would see other ranks' ids).
GUARDED_SHARDING_TYPES_FOR_FP_MODULES = {
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
}


class EmbeddingEnumerator:
    """Lists the sharding options of every table (see the module doc for the two entry points).

    Args:
        topology: the world to shard for.
        batch_size: per-rank batch size.
        constraints: ``{table name: ParameterConstraints}``.
        estimator: one estimator or a list; default: the engine's :class:`EmbeddingPerfEstimator` and
            TorchRec's storage rule, :class:`EmbeddingStorageEstimator`.
        use_exact_enumerate_order: visit modules in ``named_children`` order (default: TorchRec's
            depth-first order, which visits later children first).
    """

    def __init__(
        self,
        topology: Topology,
        batch_size: int,
        constraints: dict[str, ParameterConstraints] | None = None,
        estimator: Any = None,
        use_exact_enumerate_order: bool | None = False,
    ) -> None:
        self._topology = topology
        self._compute_device: str = topology.compute_device
        self._world_size: int = topology.world_size
        self._local_world_size: int = topology.intra_group_size
        self._batch_size = batch_size
        self._constraints = constraints
        self._use_exact_enumerate_order = bool(use_exact_enumerate_order)
        # Key-value tables live on SSD; without any, their options could never be placed.
        self._has_ssd = any(getattr(d.storage, "ssd", 0) > 0 for d in topology.devices)
        if estimator is None:
            estimator = [
                EmbeddingPerfEstimator(topology=topology, constraints=constraints),
                EmbeddingStorageEstimator(topology=topology, constraints=constraints),
            ]
        self._estimators: list[Any] = estimator if isinstance(estimator, list) else [estimator]
        self._sharder_map: dict[str, Any] = {}
        self._sharder_data_map: dict[str, Any] = {}
        self._last_stored_search_space: list[ShardingOption] | None = None
        self._last_stored_module: nn.Module | None = None
        self._last_stored_sharders: list[Any] | None = None

    @property
    def sharder_map(self) -> dict[str, Any]:
        return self._sharder_map

    @property
    def last_stored_search_space(self) -> list[ShardingOption] | None:
        return self._last_stored_search_space

    def enumerate(self, module: nn.Module, sharders: list[Any]) -> list[ShardingOption]:
        """Every table's sharding options, estimated, in module-walk order."""
        if self._last_stored_module is module and self._last_stored_sharders == sharders:
            assert self._last_stored_search_space is not None
            return copy.deepcopy(self._last_stored_search_space)
        self._sharder_map = {sharder_name(_module_type(s)): s for s in sharders}
        self._sharder_data_map = build_sharder_data_map(self._sharder_map)
        options: list[ShardingOption] = []
        for path, child in self._sharded_modules(module):
            options += self._module_options(path, child)
        self.populate_estimates(options)
        self._last_stored_module, self._last_stored_sharders = module, list(sharders)
        self._last_stored_search_space = copy.deepcopy(options)
        return options

    def _sharded_modules(self, module: nn.Module) -> list[tuple[str, nn.Module]]:
        """``(path, module)`` of every module a sharder takes; their children are not visited."""
        found, queue = [], [("", module)]
        while queue:
            path, child = queue.pop(0) if self._use_exact_enumerate_order else queue.pop()
            if sharder_name(type(child)) in self._sharder_map:
                found.append((path, child))
                continue
            queue += [(f"{path}.{name}" if path else name, sub) for name, sub in child.named_children()]
        return found

    def _module_options(self, path: str, child: nn.Module) -> list[ShardingOption]:
        key = sharder_name(type(child))
        sharder = self._sharder_map[key]
        options = []
        for name, param in sharder.shardable_parameters(child).items():
            constraint = (self._constraints or {}).get(name)
            if constraint and constraint.device_group and constraint.device_group != self._compute_device:
                continue  # the table belongs to another device group's plan
            table_options = []
            for sharding_type in self._filter_sharding_types(
                name, sharder.sharding_types(self._compute_device), key
            ):
                kernels = sharder.compute_kernels(sharding_type, self._compute_device)
                for kernel in self._filter_compute_kernels(name, kernels, sharding_type):
                    table_options.append(
                        self._option(path, child, name, param, sharding_type, kernel, constraint)
                    )
            if not table_options:
                raise ConfigError(
                    f"table {name!r} of the {key} at {path!r} has no sharding option: no sharding type and "
                    f"compute kernel offered by {type(sharder).__name__} on {self._compute_device!r} is "
                    f"allowed by its constraints (the warnings logged above name what was filtered out)"
                )
            options += table_options
        return options

    def _option(
        self,
        path: str,
        child: nn.Module,
        name: str,
        param: nn.Parameter,
        sharding_type: str,
        kernel: str,
        constraint: ParameterConstraints | None,
    ) -> ShardingOption:
        sizes, offsets = calculate_shard_sizes_and_offsets(
            tensor=param,
            world_size=self._world_size,
            local_world_size=self._local_world_size,
            sharding_type=sharding_type,
            # TorchRec reads a column-wise shard's width from min_partition.
            col_wise_shard_dim=constraint.min_partition if constraint else None,
            num_buckets=self._get_num_buckets(name, child),
        )
        return ShardingOption(
            name=name,
            tensor=param,
            module=(path, child),
            input_lengths=list(constraint.pooling_factors) if constraint else [POOLING_FACTOR],
            batch_size=self._batch_size,
            compute_kernel=kernel,
            sharding_type=sharding_type,
            partition_by=get_partition_by_type(sharding_type),
            shards=[Shard(size=size, offset=offset) for size, offset in zip(sizes, offsets)],
            cache_params=copy.deepcopy(constraint.cache_params) if constraint else None,
            enforce_hbm=constraint.enforce_hbm if constraint else None,
            stochastic_rounding=constraint.stochastic_rounding if constraint else None,
            bounds_check_mode=constraint.bounds_check_mode if constraint else None,
            dependency=_tower_dependency(path, child, name),
            feature_names=constraint.feature_names if constraint else None,
            output_dtype=constraint.output_dtype if constraint else None,
            key_value_params=copy.deepcopy(constraint.key_value_params) if constraint else None,
        )

    def _get_num_buckets(self, name: str, module: nn.Module) -> int | None:
        """The bucket count of a virtual table (its row-wise shards are whole buckets); None otherwise."""
        if isinstance(module, EmbeddingBagCollection):
            configs = module.embedding_bag_configs()
        elif isinstance(module, EmbeddingCollection):
            configs = module.embedding_configs()
        else:
            return None
        return next((c.total_num_buckets for c in configs if c.name == name and c.use_virtual_table), None)

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        for estimator in self._estimators:
            estimator.estimate(sharding_options, sharder_data_map=self._sharder_data_map)

    def _filter_sharding_types(
        self, name: str, allowed_sharding_types: list[str], sharder_key: str = ""
    ) -> list[str]:
        """The offered types the table's constraints allow (see the module doc for the defaults)."""
        constraint = (self._constraints or {}).get(name)
        allowed = [str(t) for t in allowed_sharding_types]
        if not constraint or not constraint.sharding_types:
            allowed = [t for t in allowed if t != ShardingType.GRID_SHARD.value]
            if "FeatureProcessedEmbeddingBagCollection" in sharder_key:
                allowed = [t for t in allowed if t not in GUARDED_SHARDING_TYPES_FOR_FP_MODULES]
            return allowed
        wanted = [str(t) for t in constraint.sharding_types]
        kept = [t for t in allowed if t in wanted]
        if not kept:
            logger.warning(
                "table %s: no sharding type left: its constraints allow %s, the sharder offers %s",
                name, wanted, allowed,
            )  # fmt: skip
        return kept

    def _filter_compute_kernels(
        self, name: str, allowed_compute_kernels: list[str], sharding_type: str
    ) -> list[str]:
        """The offered kernels the table's constraints allow (default: all but the key-value ones)."""
        constraint = (self._constraints or {}).get(name)
        if constraint and constraint.compute_kernels:
            wanted = [str(k) for k in constraint.compute_kernels]
        else:
            wanted = [k.value for k in EmbeddingComputeKernel if k not in GUARDED_COMPUTE_KERNELS]
        kept = [str(k) for k in allowed_compute_kernels if str(k) in wanted]
        if not self._has_ssd and _K.KEY_VALUE.value in kept:
            kept.remove(_K.KEY_VALUE.value)
        if _K.DENSE.value in kept and _K.FUSED.value in kept:
            kept.remove(_K.DENSE.value)  # the fused kernel does the same work without a gradient tensor
        if not kept:
            logger.warning(
                "table %s, sharding type %s: no compute kernel left: its constraints allow %s, the sharder "
                "offers %s",
                name, sharding_type, wanted, list(allowed_compute_kernels),
            )  # fmt: skip
        return kept

    # rectrain's planner: options from table configs.

    def enumerate_tables(
        self,
        tables: dict[str, list[BaseEmbeddingConfig]],
        constraints: dict[str, ParameterConstraints],
        offered: list[ShardingType] | None = None,
    ) -> list[list[ShardingOption]]:
        """Options per table, tables ordered by (module path, table name); ``offered`` (the sharders' types)
        narrows every table's allowed sharding types."""
        result = []
        for module_path in sorted(tables):
            for table in sorted(tables[module_path], key=lambda t: t.name):
                constraint = _narrowed(
                    constraints.get(table.name, ParameterConstraints()).validate(), offered
                )
                options = self._table_options(module_path, table, constraint)
                if not options:
                    raise ConfigError(
                        f"table {table.name!r} (module {module_path!r}): no sharding is legal with "
                        f"sharding_types={_names(constraint.sharding_types)} and "
                        f"compute_kernels={_names(constraint.compute_kernels)}: "
                        + "; ".join(self._refusals(table, constraint))
                    )
                result.append(options)
        self._last_stored_search_space = [option for options in result for option in options]
        return result

    def _table_options(
        self, module_path: str, table: BaseEmbeddingConfig, constraint: ParameterConstraints
    ) -> list[ShardingOption]:
        features = constraint.per_feature(table, self._batch_size)
        allowed_types = constraint.sharding_types or list(PLANNED_SHARDING_TYPES)
        allowed_kernels = constraint.compute_kernels or list(RUNNABLE_KERNELS)
        options = []
        for sharding_type in PLANNED_SHARDING_TYPES:
            if sharding_type not in allowed_types:
                continue
            for shards in self._shapes(table, sharding_type, constraint):
                for kernel in (*RUNNABLE_KERNELS, EmbeddingComputeKernel.KEY_VALUE):
                    if kernel in allowed_kernels and _kernel_fits(sharding_type, kernel):
                        options.append(
                            ShardingOption.for_table(
                                module_path, table, sharding_type, kernel, shards, features, constraint
                            )
                        )
        return options

    def _refusals(self, table: BaseEmbeddingConfig, constraint: ParameterConstraints) -> list[str]:
        """Why each allowed sharding type has no option (the reasons TorchRec's enumerator has too)."""
        reasons = []
        allowed_kernels = constraint.compute_kernels or list(RUNNABLE_KERNELS)
        reasons += [k.unsupported_reason for k in allowed_kernels if k.unsupported_reason]
        for kind in constraint.sharding_types or list(PLANNED_SHARDING_TYPES):
            if kind.unsupported_reason:
                reasons.append(kind.unsupported_reason)
            elif not self._shapes(table, kind, constraint):
                parts = self._topology.world_size if kind == ShardingType.ROW_WISE else None
                parts = parts or self._topology.local_world_size
                reasons.append(
                    f"{kind.value} shards would have {math.ceil(table.num_embeddings / parts)} rows, fewer "
                    f"than min_partition={constraint.min_partition}"
                )
            elif not any(_kernel_fits(kind, k) for k in allowed_kernels):
                kernel = "dense" if kind == ShardingType.DATA_PARALLEL else "fused"
                reasons.append(
                    f"{kind.value} runs only the {kernel} kernel (as in TorchRec: replicas all-reduce their "
                    "gradients, routed shards update in backward)"
                )
        return reasons

    def _shapes(
        self, table: BaseEmbeddingConfig, sharding_type: ShardingType, constraint: ParameterConstraints
    ) -> list[list[Shard]]:
        rows, cols = table.num_embeddings, table.embedding_dim
        topo = self._topology
        min_part = constraint.min_partition or 1
        if sharding_type in (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE):
            return [[Shard(0, rows, 0, cols)]]
        if sharding_type == ShardingType.ROW_WISE:
            if math.ceil(rows / topo.world_size) < min_part:
                return []
            return [
                [Shard(o, n, 0, cols, rank=i) for i, (o, n) in enumerate(row_blocks(rows, topo.world_size))]
            ]
        if sharding_type == ShardingType.TABLE_ROW_WISE:
            # On one host (local_world_size == world_size) this is row-wise within the host, as in TorchRec;
            # offered only when asked for, since unasked it would duplicate the row-wise option.
            if topo.num_hosts == 1 and ShardingType.TABLE_ROW_WISE not in (constraint.sharding_types or []):
                return []
            if math.ceil(rows / topo.local_world_size) < min_part:
                return []
            return [[Shard(o, n, 0, cols) for o, n in row_blocks(rows, topo.local_world_size)]]
        assert sharding_type == ShardingType.COLUMN_WISE
        return [
            [Shard(0, rows, o, n) for o, n in column_blocks(cols, width)]
            for width in self._column_widths(cols, constraint)
        ]

    def _column_widths(self, cols: int, constraint: ParameterConstraints) -> list[int]:
        """Column-wise shard widths to try; ``[cols]`` (one column shard, as TorchRec places a table narrower
        than its minimum shard dim) when the table cannot be split further."""
        width = constraint.column_wise_shard_dim
        min_part = constraint.min_partition or (4 if width is not None else CW_SHARD_DIMS[0])
        if width is not None:
            # An explicit width may give more shards than ranks; several shards then share a rank.
            return [width] if min_part <= width < cols else [cols]
        even_split = 4 * math.ceil(cols / self._topology.world_size / 4)
        candidates = {*CW_SHARD_DIMS, even_split}
        widths = sorted(
            w for w in candidates if min_part <= w < cols and math.ceil(cols / w) <= self._topology.world_size
        )
        return widths or [cols]


def _module_type(sharder: Any) -> type:
    module_type = sharder.module_type
    return module_type if isinstance(module_type, type) else type(module_type)


def _tower_dependency(path: str, child: nn.Module, name: str) -> str | None:
    """The embedding tower a table must stay with: the tower's path (``<collection>.tower_<i>`` inside a
    tower collection); None outside towers."""
    if isinstance(child, EmbeddingTower):
        return path
    if isinstance(child, EmbeddingTowerCollection):
        return f"{path}.tower_{child.tower_index_of(name)}"
    return None


def _narrowed(constraint: ParameterConstraints, offered: list[ShardingType] | None) -> ParameterConstraints:
    if offered is None:
        return constraint
    allowed = [t for t in constraint.sharding_types or list(PLANNED_SHARDING_TYPES) if t in offered]
    if not allowed:
        raise ConfigError(
            f"no sharding type is both allowed by the constraints ({_names(constraint.sharding_types)}) and "
            f"offered by the sharders ({_names(offered)})"
        )
    return dataclasses.replace(constraint, sharding_types=allowed)


def _kernel_fits(sharding_type: ShardingType, kernel: EmbeddingComputeKernel) -> bool:
    # A replicated table needs its gradient materialised for the all-reduce, so only the dense kernel; a
    # routed shard is updated in backward by the fused kernel (TorchRec's sharders offer the same pairs, so
    # compute_kernels=["dense"] makes a table data-parallel, as in TorchRec).
    if kernel is EmbeddingComputeKernel.KEY_VALUE:  # the fused kernel over a disk table
        return sharding_type != ShardingType.DATA_PARALLEL
    if kernel not in RUNNABLE_KERNELS:
        return False
    return (sharding_type == ShardingType.DATA_PARALLEL) == (kernel == EmbeddingComputeKernel.DENSE)


def _names(values: list | None) -> str:
    return "all" if values is None else "[" + ", ".join(str(v) for v in values) + "]"
