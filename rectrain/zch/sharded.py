"""The rank-local steps of TorchRec's sharded managed-collision collection (``distributed.mc_modules``).

rectrain's ``DistributedModelParallel`` does not shard managed-collision modules yet (it refuses them by name,
``refuse_managed_collision``), so the sharded classes here cannot be built by a sharder: their constructors
refuse the same way. What they define is the rank-local remapping TorchRec's contract names, over this
package's remappers (``profile`` / ``remap``): ``compute`` remaps each sharding's features table by table and
moves the remapped global rows to the shard's local rows; the inference collection's ``output_dist`` joins the
ranks' remapped features in input order; ``ShardedMCCRemapper`` is one rank's remapper of inference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rectrain.distributed.interfaces.contexts import EmbeddingCollectionContext
from rectrain.distributed.interfaces.kjt_list import KJTList
from rectrain.errors import ConfigError
from rectrain.planner.types import ShardingType
from rectrain.sparse.jagged import JaggedTensor
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor
from rectrain.zch.collection import ManagedCollisionCollection

_REFUSED = (
    "rectrain cannot shard managed-collision modules yet (TorchRec shards remappers row-wise with their "
    "tables); train the model unsharded"
)


@torch.fx.wrap
def input_dist_permute(
    features: KeyedJaggedTensor, features_order: list[int], features_order_tensor: torch.Tensor
) -> KeyedJaggedTensor:
    return features.permute(features_order, features_order_tensor)


@torch.fx.wrap
def _fx_global_to_local_index(
    feature_dict: dict[str, JaggedTensor], feature_to_offset: dict[str, int]
) -> dict[str, JaggedTensor]:
    for feature, jt in feature_dict.items():
        jt._values = jt.values() - feature_to_offset[feature]
    return feature_dict


@torch.fx.wrap
def _fx_jt_dict_add_offset(
    feature_dict: dict[str, JaggedTensor], feature_to_offset: dict[str, int]
) -> dict[str, JaggedTensor]:
    for feature, jt in feature_dict.items():
        jt._values = jt.values() + feature_to_offset[feature]
    return feature_dict


@torch.fx.wrap
def _get_length_per_key(kjt: KeyedJaggedTensor) -> torch.Tensor:
    return torch.tensor(kjt.length_per_key())


@torch.fx.wrap
def _cat_jagged_values(jd: dict[str, JaggedTensor]) -> torch.Tensor:
    return torch.cat([jt.values() for jt in jd.values()])


@torch.fx.wrap
def update_jagged_tensor_dict(
    output: dict[str, JaggedTensor], new_dict: dict[str, JaggedTensor]
) -> dict[str, JaggedTensor]:
    output.update(new_dict)
    return output


@dataclass
class ManagedCollisionCollectionContext(EmbeddingCollectionContext):
    """A managed-collision collection's batch: an ``EmbeddingCollectionContext``, as TorchRec's."""


def create_mc_sharding(sharding_type: str, sharding_infos: list[Any], env: Any, device: Any = None) -> Any:
    if sharding_type != ShardingType.ROW_WISE.value:
        raise ValueError(f"Sharding type not supported {sharding_type}")
    raise ConfigError(_REFUSED)


class ShardedManagedCollisionCollection(nn.Module):
    """One rank's managed-collision collection: its tables' remappers, its shardings' tables and features.
    Not built here (see the module docstring); ``compute`` is TorchRec's rank-local remapping."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(_REFUSED)

    def global_to_local_index(self, jt_dict: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return _fx_global_to_local_index(jt_dict, self._table_to_offset)

    def get_lookup_value(
        self, table: str, features: KeyedJaggedTensor, write_weights: torch.Tensor | None = None
    ) -> dict[str, JaggedTensor]:
        remapper = self._managed_collision_modules[table]
        lengths = torch.tensor(features.length_per_key())  # the remapper's per-feature split, as TorchRec's
        mc_input = {
            table: JaggedTensor(values=features.values(), lengths=features.lengths(), weights=lengths)
        }
        return self.global_to_local_index(remapper.remap(remapper.profile(mc_input)))

    def compute(self, ctx: ManagedCollisionCollectionContext, dist_input: KJTList) -> KJTList:
        remapped = []
        shardings = zip(
            dist_input,
            ctx.sharding_contexts,
            self._sharding_tables,
            self._sharding_per_table_feature_splits,
            self._sharding_features,
        )
        for features, sharding_ctx, tables, splits, names in shardings:
            if not features.variable_stride_per_key():
                sharding_ctx.lengths_after_input_dist = features.lengths().view(-1, features.stride())
            weights = features.weights_or_none() if self._use_2d_weights else None
            parts = features.split(splits) if len(splits) > 1 else [features]
            output: dict[str, JaggedTensor] = {}
            offset = 0
            for table, kjt in zip(tables, parts):
                count = kjt.values().numel()
                rows = weights[offset : offset + count] if weights is not None else None
                output.update(self.get_lookup_value(table, kjt, write_weights=rows))
                offset += count
            remapped.append(
                KeyedJaggedTensor(
                    keys=names,
                    values=torch.cat([jt.values() for jt in output.values()]),
                    lengths=torch.cat([jt.lengths() for jt in output.values()]),
                    weights=None if self._use_2d_weights else features.weights_or_none(),
                    stride_per_key_per_rank=features._stride_per_key_per_rank,
                )
            )
        return KJTList(remapped)

    def create_context(self) -> ManagedCollisionCollectionContext:
        return ManagedCollisionCollectionContext(sharding_contexts=[])

    @property
    def unsharded_module_type(self) -> type[ManagedCollisionCollection]:
        return ManagedCollisionCollection


class ShardedQuantManagedCollisionCollection(ShardedManagedCollisionCollection):
    """The inference collection: remapping runs in its ``ShardedMCCRemapper``s, ``output_dist`` joins them."""

    def compute(self, ctx: ManagedCollisionCollectionContext, rank: int, dist_input: KJTList) -> KJTList:
        raise NotImplementedError("the inference collection remaps in its ShardedMCCRemapper modules")

    def output_dist(self, ctx: ManagedCollisionCollectionContext, output: KJTList) -> KeyedJaggedTensor:
        if len(output) <= 1:
            return output[0] if len(output) else KeyedJaggedTensor.empty()
        values = torch.cat([kjt.values() for kjt in output])
        sharding = ctx.sharding_contexts[0] if ctx.sharding_contexts else None
        unbucketize = getattr(sharding, "unbucketize_permute_tensor", None)
        if unbucketize is not None:  # back to the input's order
            values = values.index_select(0, unbucketize)
        before = getattr(sharding, "features_before_input_dist", None)
        lengths = before.lengths() if before is not None else torch.cat([kjt.lengths() for kjt in output])
        return KeyedJaggedTensor(keys=self._feature_names, values=values, lengths=lengths)


class ShardedMCCRemapper(nn.Module):
    """One rank's remappers of inference: features grouped by table (``table_feature_splits``), each table's
    remapped rows made local to its shard (``shard_metadata``: table -> [offset, size])."""

    def __init__(
        self,
        table_feature_splits: list[int],
        fns: list[str],
        managed_collision_modules: nn.ModuleDict,
        shard_metadata: dict[str, list[int]],
    ) -> None:
        super().__init__()
        self._table_feature_splits, self._fns = table_feature_splits, fns
        self.zchs = managed_collision_modules
        self._shard_metadata = shard_metadata
        self._table_to_offset = {table: meta[0] for table, meta in shard_metadata.items()}
        tables = [t for t, n in zip(self.zchs.keys(), table_feature_splits) for _ in range(n)]
        self._feature_to_offset = {f: self._table_to_offset[t] for f, t in zip(fns, tables)}

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        parts = features.split(self._table_feature_splits)
        output: dict[str, JaggedTensor] = {}
        for i, (table, remapper) in enumerate(self.zchs.items()):
            kjt = parts[i]
            mc_input = {
                table: JaggedTensor(kjt.values(), lengths=kjt.lengths(), weights=_get_length_per_key(kjt))
            }
            output[table] = self.global_to_local_index(remapper(mc_input))[table]
        return KeyedJaggedTensor(
            keys=self._fns,
            values=_cat_jagged_values(output),
            lengths=features.lengths(),
            weights=features.weights_or_none(),
        )

    def global_to_local_index(self, jt_dict: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return _fx_global_to_local_index(jt_dict, self._table_to_offset)


class BaseShardedManagedCollisionEmbeddingCollection(nn.Module):
    """TorchRec's sharded managed-collision embedding collections: refused (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(_REFUSED)


class ShardedManagedCollisionEmbeddingCollection(BaseShardedManagedCollisionEmbeddingCollection):
    pass


class ShardedManagedCollisionEmbeddingBagCollection(BaseShardedManagedCollisionEmbeddingCollection):
    pass
