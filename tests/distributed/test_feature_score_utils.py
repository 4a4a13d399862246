"""Feature scores for virtual-table eviction: off for plain tables (features untouched); with a score policy,
each value's weight is its feature's score (the default for features the mapping leaves out)."""

import torch

from rectrain.distributed.embedding_sharding import EmbeddingShardingInfo
from rectrain.distributed.feature_score_utils import (
    create_sharding_type_to_feature_score_mapping,
    may_collect_feature_scores,
)
from rectrain.modules.embedding_configs import EmbeddingBagConfig, FeatureScoreBasedEvictionPolicy
from rectrain.sparse import KeyedJaggedTensor


def _kjt() -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 0, 1, 0])
    )


def test_plain_tables_collect_nothing() -> None:
    table = EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t", feature_names=["a", "b"])
    info = EmbeddingShardingInfo(table, param_sharding=None, param=torch.zeros(10, 4))
    assert create_sharding_type_to_feature_score_mapping([table], {"table_wise": [info]}) == (
        False,
        False,
        {},
    )
    kjt = _kjt()
    assert may_collect_feature_scores([kjt], False, {})[0].weights_or_none() is None


def test_scores_become_per_value_weights() -> None:
    policy = FeatureScoreBasedEvictionPolicy(
        feature_score_mapping={"a": 1.5},
        feature_score_default_value=0.25,
        enable_auto_feature_score_collection=True,
    )
    table = EmbeddingBagConfig(
        num_embeddings=10,
        embedding_dim=4,
        name="t",
        feature_names=["a", "b"],
        use_virtual_table=True,
        virtual_table_eviction_policy=policy,
    )
    info = EmbeddingShardingInfo(table, param_sharding=None, param=torch.zeros(10, 4))
    accumulate, auto, mapping = create_sharding_type_to_feature_score_mapping(
        [table], {"row_wise": [info], "data_parallel": [info]}
    )
    assert (accumulate, auto) == (True, True)
    assert mapping == {"row_wise": {"a": 1.5, "b": 0.25}, "data_parallel": {}}
    (out,) = may_collect_feature_scores([_kjt()], auto, {"row_wise": mapping["row_wise"]})
    assert out.weights().tolist() == [1.5, 1.5, 0.25]
