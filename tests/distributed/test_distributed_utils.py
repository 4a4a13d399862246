import pytest
import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata

from rectrain.distributed.types import CacheAlgorithm, CacheParams, ParameterSharding, ShardingBucketMetadata
from rectrain.distributed.utils import (
    add_params_from_parameter_sharding,
    convert_to_fbgemm_types,
    get_bucket_metadata_from_shard_metadata,
    get_unsharded_module_names,
    merge_fused_params,
)
from rectrain.embedding.config import DataType
from rectrain.sparse import KeyedJaggedTensor
from rectrain.sparse.test_utils import keyed_jagged_tensor_equals


def test_bucket_metadata_of_row_wise_shards():
    shards = [ShardMetadata([0, 0], [4, 8], "rank:0/cpu"), ShardMetadata([4, 0], [8, 8], "rank:1/cpu")]
    assert get_bucket_metadata_from_shard_metadata(shards, 6) == ShardingBucketMetadata([2, 4], [0, 2], 2)
    with pytest.raises(AssertionError, match="Table size '12' must be divisible by num_buckets '5'"):
        get_bucket_metadata_from_shard_metadata(shards, 5)


def test_fused_params_take_the_tables_options_over_the_sharders():
    assert merge_fused_params({"learning_rate": 0.1, "eps": 1.0}, {"lr": 0.5}) == {
        "learning_rate": 0.5,
        "eps": 1.0,
    }
    sharding = ParameterSharding(
        "table_wise",
        "fused",
        [0],
        cache_params=CacheParams(algorithm=CacheAlgorithm.LFU),
        stochastic_rounding=False,
    )
    given = {"cache_algorithm": CacheAlgorithm.LRU, "stochastic_rounding": True, "learning_rate": 0.1}
    assert add_params_from_parameter_sharding(given, sharding) == {
        "cache_algorithm": CacheAlgorithm.LFU,
        "stochastic_rounding": False,
        "learning_rate": 0.1,
    }
    assert convert_to_fbgemm_types({"output_dtype": DataType.FP16}) == {"output_dtype": SparseType.FP16}


def test_unsharded_module_names_are_the_siblings_of_sharded_modules():
    class Fake(nn.Module):
        def sharded_modules(self):
            return {"sparse.ebc": self.sparse.ebc}

    model = Fake()
    model.sparse, model.dense, model.over = nn.Module(), nn.Linear(1, 1), nn.Linear(1, 1)
    model.sparse.ebc, model.sparse.proj = nn.Linear(1, 1), nn.Linear(1, 1)
    assert sorted(get_unsharded_module_names(model)) == ["dense", "over", "sparse.proj"]


def test_kjt_equality_ignores_id_order_within_a_bag_only_for_pooled_features():
    lengths = torch.tensor([2, 1])
    a = KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=lengths)
    b = KeyedJaggedTensor(["f"], torch.tensor([2, 1, 3]), lengths=lengths)
    assert not keyed_jagged_tensor_equals(a, b) and keyed_jagged_tensor_equals(a, b, is_pooled_features=True)
    assert not keyed_jagged_tensor_equals(a, None) and keyed_jagged_tensor_equals(None, None)
