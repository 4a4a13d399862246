"""``torchrec.distributed.mc_modules`` at rectrain's path: its sharder (planning only; ``mc_sharders``), the
sharded collection's rank-local steps (``rectrain.zch.sharded``)."""

from rectrain.distributed.interfaces.contexts import EmbeddingCollectionContext
from rectrain.distributed.parallel.mc_sharders import ManagedCollisionCollectionSharder
from rectrain.zch.sharded import (
    ManagedCollisionCollectionContext,
    ShardedManagedCollisionCollection,
    ShardedMCCRemapper,
    ShardedQuantManagedCollisionCollection,
    _cat_jagged_values,
    _fx_global_to_local_index,
    _fx_jt_dict_add_offset,
    _get_length_per_key,
    create_mc_sharding,
    input_dist_permute,
    update_jagged_tensor_dict,
)

__all__ = [
    "EmbeddingCollectionContext",
    "ManagedCollisionCollectionContext",
    "ManagedCollisionCollectionSharder",
    "ShardedMCCRemapper",
    "ShardedManagedCollisionCollection",
    "ShardedQuantManagedCollisionCollection",
    "_cat_jagged_values",
    "_fx_global_to_local_index",
    "_fx_jt_dict_add_offset",
    "_get_length_per_key",
    "create_mc_sharding",
    "input_dist_permute",
    "update_jagged_tensor_dict",
]
