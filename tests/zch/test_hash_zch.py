"""HashZchManagedCollisionModule (multi-probe ZCH on FBGEMM's kernel) on CPU: read-only lookups, misses,
state, shards; inserting ids (CUDA only) is refused on CPU by name."""

import pytest
import torch

from rectrain.sparse import JaggedTensor
from rectrain.zch.hash_evictions import HashZchEvictionConfig, HashZchEvictionPolicyName
from rectrain.zch.hash_zch import HashZchManagedCollisionModule

CPU = torch.device("cpu")


def _jt(ids, lengths=None):
    lengths = torch.ones(len(ids), dtype=torch.int64) if lengths is None else torch.tensor(lengths)
    return {"t": JaggedTensor(values=torch.tensor(ids, dtype=torch.int64), lengths=lengths)}


def _serving(owners, **kwargs):
    """A read-only module whose rows are owned by ``owners`` (as a trained checkpoint would leave them)."""
    module = HashZchManagedCollisionModule(
        zch_size=len(owners),
        device=CPU,
        total_num_buckets=1,
        max_probe=len(owners),
        is_inference=True,
        **kwargs,
    )
    module._hash_zch_identities.data.copy_(torch.tensor(owners).view(-1, 1))
    return module


def test_training_on_cpu_is_refused_by_name():
    module = HashZchManagedCollisionModule(zch_size=16, device=CPU, total_num_buckets=2)
    with pytest.raises(RuntimeError, match="inserts ids on CUDA only"):
        module(_jt([1, 2]))


def test_each_id_finds_the_row_it_owns():
    module = _serving([40, 10, 30, 20])
    assert module(_jt([10, 20, 30, 40, 10]))["t"].values().tolist() == [1, 3, 2, 0, 1]
    assert module.evict() is None


def test_a_miss_falls_back_to_some_row_or_is_dropped():
    fallback = _serving([40, 10, 30, 20])
    rows = fallback(_jt([10, 99]))["t"].values().tolist()
    assert rows[0] == 1 and 0 <= rows[1] < 4
    dropping = _serving([40, 10, 30, 20], disable_fallback=True)
    out = dropping(_jt([10, 99, 20, 98], lengths=[2, 0, 2]))["t"]
    assert out.values().tolist() == [1, 3]
    assert out.lengths().tolist() == [1, 0, 1]


def test_read_only_suffix_features_never_insert():
    module = HashZchManagedCollisionModule(zch_size=4, device=CPU, total_num_buckets=1)
    module._hash_zch_identities.data.copy_(torch.tensor([[7], [8], [9], [6]]))
    features = {"t_readonly": JaggedTensor(values=torch.tensor([9, 7]), lengths=torch.tensor([1, 1]))}
    assert module(features)["t_readonly"].values().tolist() == [2, 0]  # training mode, yet read only


def test_state_dict_round_trip_and_inference_loading():
    trained = HashZchManagedCollisionModule(
        zch_size=4,
        device=CPU,
        total_num_buckets=1,
        max_probe=4,
        eviction_policy_name=HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
        eviction_config=HashZchEvictionConfig(features=["f"], single_ttl=1),
    )
    trained._hash_zch_identities.data.copy_(torch.tensor([[3], [1], [2], [4]]))
    state = trained.state_dict()
    assert {"_hash_zch_identities", "_hash_zch_metadata", "_hash_zch_bucket"} <= set(state)
    serving = HashZchManagedCollisionModule(
        zch_size=4, device=CPU, total_num_buckets=1, max_probe=4, is_inference=True
    )
    serving.load_state_dict(state)  # the metadata is dropped: an inference module keeps none
    assert serving._hash_zch_metadata is None
    assert serving(_jt([4, 3]))["t"].values().tolist() == [3, 0]


def test_shards_cover_whole_buckets_and_offset_their_rows():
    module = HashZchManagedCollisionModule(zch_size=20, device=CPU, total_num_buckets=4)
    shard = module.rebuild_with_output_id_range((10, 20))
    assert shard.is_sharded and shard.output_size() == 10
    assert shard._output_global_offset_tensor.tolist() == [10]
    with pytest.raises(RuntimeError, match="bucket boundaries"):
        module.rebuild_with_output_id_range((3, 10))


def test_uneven_buckets_need_output_segments():
    with pytest.raises(ValueError, match="output_segments"):
        HashZchManagedCollisionModule(zch_size=10, device=CPU, total_num_buckets=3)
