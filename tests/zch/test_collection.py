"""ManagedCollisionCollection: one remapper per table over a KeyedJaggedTensor."""

import pytest
import torch

from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.sparse import KeyedJaggedTensor
from rectrain.zch.collection import ManagedCollisionCollection
from rectrain.zch.eviction import LFU_EvictionPolicy
from rectrain.zch.mch import MCHManagedCollisionModule

TABLES = [
    EmbeddingBagConfig(name="users", num_embeddings=8, embedding_dim=4, feature_names=["user", "friend"]),
    EmbeddingBagConfig(name="products", num_embeddings=5, embedding_dim=4, feature_names=["item"]),
]


def _mch(size):
    return MCHManagedCollisionModule(
        zch_size=size, device=torch.device("cpu"), eviction_policy=LFU_EvictionPolicy(), eviction_interval=1
    )


def _mcc():
    return ManagedCollisionCollection({"products": _mch(5), "users": _mch(8)}, TABLES)


def test_features_come_back_in_table_order_with_extra_keys_dropped():
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["item", "other", "friend", "user"],
        values=torch.tensor([50, 60, 1, 2, 70, 80, 90]),
        lengths=torch.tensor([1, 1, 1, 1, 1, 1, 1, 0]),
        weights=torch.arange(7, dtype=torch.float),
    )
    out = _mcc()(kjt)
    assert out.keys() == ["user", "friend", "item"]
    assert out.lengths().tolist() == [1, 0, 1, 1, 1, 1]
    assert out.weights().tolist() == [6.0, 4.0, 5.0, 0.0, 1.0]  # each id keeps its weight
    # "user" and "friend" share the users table: equal ids, equal rows.
    users = out["user"].values().tolist() + out["friend"].values().tolist()
    assert all(0 <= r < 7 for r in users) and len(set(users)) == 3
    assert all(0 <= r < 4 for r in out["item"].values().tolist())


def test_a_table_without_module_or_a_size_mismatch_is_refused():
    with pytest.raises(ValueError, match="'products' has no module"):
        ManagedCollisionCollection({"users": _mch(8)}, TABLES)
    with pytest.raises(ValueError, match="num_embeddings=5"):
        ManagedCollisionCollection({"users": _mch(8), "products": _mch(6)}, TABLES)
    with pytest.raises(ValueError, match=r"\['extra'\] have no table"):
        ManagedCollisionCollection({"users": _mch(8), "products": _mch(5), "extra": _mch(3)}, TABLES)


def test_state_dict_holds_each_tables_remapper():
    keys = _mcc().state_dict().keys()
    assert "_managed_collision_modules.users._mch_sorted_raw_ids" in keys
    assert "_managed_collision_modules.products._mch_remapped_ids_mapping" in keys


def test_evict_and_open_slots_per_table():
    mcc = _mcc()
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["user", "friend", "item"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1])
    )
    mcc(kjt)
    assert mcc.open_slots()["users"].item() == 5 and mcc.open_slots()["products"].item() == 3
    evicted = mcc.evict()
    assert evicted["users"].numel() == 2 and evicted["products"].numel() == 1
    assert mcc.evict() == {"users": None, "products": None}
