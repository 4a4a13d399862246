"""construct_module_sharding_plan takes TorchRec's arguments in TorchRec's order."""

import pytest
import torch

from rectrain.distributed.sharding_plan import (
    EmbeddingCollectionSharder,
    apply_to_all,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.errors import ConfigError

TABLES = [
    EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=40, feature_names=["f0"]),
    EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=40, feature_names=["f1"]),
]


class _TableWiseOnly:
    def sharding_types(self, compute_device_type: str) -> list[str]:
        return ["table_wise"]


def test_keywords_in_torchrecs_order() -> None:
    plan = construct_module_sharding_plan(
        TABLES, {"t0": row_wise(), "t1": table_wise(rank=1)}, None, 2, 4, "cpu"
    )
    assert plan["t1"].ranks == [1]
    assert len(plan["t0"].ranks) == 4  # world_size 4 (fifth positional), not local_size


def test_world_size_needed_without_a_process_group() -> None:
    with pytest.raises(ConfigError, match="world_size"):
        construct_module_sharding_plan(TABLES, {"t0": table_wise(rank=0)})


def test_sharder_refuses_a_type_it_cannot_shard() -> None:
    ok = construct_module_sharding_plan(TABLES, {"t0": table_wise(rank=0)}, _TableWiseOnly(), world_size=2)
    assert ok["t0"].ranks == [0]
    with pytest.raises(ConfigError, match="t1.*sharder"):
        construct_module_sharding_plan(TABLES, {"t1": data_parallel()}, _TableWiseOnly(), world_size=2)


def test_apply_to_all_gives_every_table_the_generator() -> None:
    ebc = EmbeddingBagCollection(tables=TABLES, device=torch.device("meta"))
    plan = construct_module_sharding_plan(ebc, apply_to_all(ebc, table_wise(rank=1)), world_size=2)
    assert {name: p.ranks for name, p in plan.items()} == {"t0": [1], "t1": [1]}
    with pytest.raises(ConfigError, match="no sharder for a EmbeddingBagCollection"):
        apply_to_all(ebc, row_wise(), EmbeddingCollectionSharder())
