"""MCH eviction policies: who enters a full table, who leaves, and that the miss row never goes."""

import torch

from rectrain.sparse import JaggedTensor
from rectrain.zch.eviction import DistanceLFU_EvictionPolicy, LFU_EvictionPolicy, LRU_EvictionPolicy
from rectrain.zch.mch import MCHManagedCollisionModule

EMPTY = torch.iinfo(torch.int64).max


def _module(policy, size=4, interval=1):
    return MCHManagedCollisionModule(
        zch_size=size, device=torch.device("cpu"), eviction_policy=policy, eviction_interval=interval
    )


def _feed(module, ids):
    values = torch.tensor(ids, dtype=torch.int64)
    module.profile({"f": JaggedTensor(values=values, lengths=torch.ones(len(ids), dtype=torch.int64))})


def test_lfu_keeps_the_most_frequent_ids_and_the_miss_row():
    module = _module(LFU_EvictionPolicy())
    _feed(module, [7, 7, 7, 8, 8, 9, 10])  # 3 rows for ids, the 4th is the miss row
    assert module._mch_sorted_raw_ids.tolist() == [7, 8, 9, EMPTY]
    _feed(module, [11, 11, 11, 11])  # 11 outnumbers 9 (seen once) but not 7 (3) or 8 (2)
    assert module._mch_sorted_raw_ids.tolist() == [7, 8, 11, EMPTY]
    assert module._mch_counts.tolist()[-1] == EMPTY  # the miss row is pinned


def test_lru_replaces_the_least_recently_seen():
    module = _module(LRU_EvictionPolicy())
    _feed(module, [1, 2, 3])
    _feed(module, [2, 3])
    _feed(module, [4])
    assert module._mch_sorted_raw_ids.tolist() == [2, 3, 4, EMPTY]
    assert module._mch_last_access_iter.tolist() == [2, 2, 3, 3]


def test_distance_lfu_weighs_count_by_recency():
    module = _module(DistanceLFU_EvictionPolicy(decay_exponent=1.0))
    _feed(module, [1, 1, 1, 1, 2, 3])
    _feed(module, [4, 4])
    # Step 2: 1 scores 4 / 2, 2 and 3 score 1 / 2, 4 scores 2 / 1: 3 (last by stable order) leaves.
    assert module._mch_sorted_raw_ids.tolist() == [1, 2, 4, EMPTY]
    assert module._mch_counts.tolist()[:3] == [4, 1, 2]


def test_rows_follow_their_ids_through_evictions():
    module = _module(LFU_EvictionPolicy())
    # The history holds 1.25 x the first batch per interval (TorchRec's sizing): make it big enough.
    _feed(module, [5, 6, 7, 5, 6, 7])
    before = {int(i): int(r) for i, r in zip(module._mch_sorted_raw_ids, module._mch_remapped_ids_mapping)}
    assert sorted(module.evict().tolist()) == [0, 1, 2]  # empty rows handed to ids count too
    _feed(module, [5, 6, 9, 9, 9])
    after = {int(i): int(r) for i, r in zip(module._mch_sorted_raw_ids, module._mch_remapped_ids_mapping)}
    assert after[5] == before[5] and after[6] == before[6]
    assert after[9] == before[7]  # 9 took 7's row
    assert module.evict().tolist() == [before[7]]
    assert module.evict() is None
