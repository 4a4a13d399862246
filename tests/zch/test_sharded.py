"""The rank-local steps of a sharded managed-collision collection: one rank's remapper makes remapped rows
local to its shard; building a sharded collection is refused by name (DMP does not shard remappers yet)."""

import pytest
import torch
from torch import nn

from rectrain.errors import ConfigError
from rectrain.sparse import KeyedJaggedTensor
from rectrain.sparse.jagged import JaggedTensor
from rectrain.zch.eviction import LFU_EvictionPolicy
from rectrain.zch.mch import MCHManagedCollisionModule
from rectrain.zch.sharded import (
    ShardedManagedCollisionCollection,
    ShardedManagedCollisionEmbeddingCollection,
    ShardedMCCRemapper,
    create_mc_sharding,
)


def _mch(offset: int) -> MCHManagedCollisionModule:
    return MCHManagedCollisionModule(
        zch_size=5,
        device=torch.device("cpu"),
        eviction_policy=LFU_EvictionPolicy(),
        eviction_interval=1,
        output_global_offset=offset,
    )


def test_remapper_returns_the_shards_local_rows() -> None:
    torch.manual_seed(0)
    remapper = ShardedMCCRemapper(
        table_feature_splits=[2],
        fns=["user", "friend"],
        managed_collision_modules=nn.ModuleDict({"users": _mch(100)}),
        shard_metadata={"users": [100, 5]},
    )
    assert remapper._feature_to_offset == {"user": 100, "friend": 100}
    kjt = KeyedJaggedTensor(
        keys=["user", "friend"], values=torch.tensor([7, 9, 7]), lengths=torch.tensor([2, 1])
    )
    reference = _mch(100)
    reference.load_state_dict(remapper.zchs["users"].state_dict())
    out = remapper(kjt)
    expected = reference({"users": JaggedTensor(kjt.values(), lengths=torch.tensor([3]))})["users"].values()
    assert out.keys() == ["user", "friend"]
    assert out.lengths().tolist() == [2, 1]
    assert out.values().tolist() == (expected - 100).tolist()
    assert all(0 <= v < 5 for v in out.values().tolist())
    assert out.values()[0] == out.values()[2]  # equal ids, equal rows


def test_building_a_sharded_collection_is_refused_by_name() -> None:
    for cls in (ShardedManagedCollisionCollection, ShardedManagedCollisionEmbeddingCollection):
        with pytest.raises(ConfigError, match="cannot shard managed-collision modules"):
            cls()
    with pytest.raises(ValueError, match="table_wise"):
        create_mc_sharding("table_wise", [], env=None)
    with pytest.raises(ConfigError, match="cannot shard managed-collision modules"):
        create_mc_sharding("row_wise", [], env=None)
