"""The eviction inputs MPZCH's kernel reads: each id's expiry hour and the current hour."""

from unittest.mock import patch

import pytest
import torch

from rectrain.sparse import JaggedTensor
from rectrain.zch.hash_evictions import (
    HashZchEvictionConfig,
    HashZchEvictionModule,
    HashZchEvictionPolicyName,
    get_kernel_from_policy,
)

HOUR = 3600.0


def _feature(per_feature):
    ids = sum(per_feature)
    return JaggedTensor(
        values=torch.arange(ids),
        lengths=torch.ones(ids, dtype=torch.int64),
        weights=torch.tensor(per_feature),
    )


def test_single_ttl_expires_every_id_ttl_hours_from_now():
    module = HashZchEvictionModule(
        HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
        torch.device("cpu"),
        HashZchEvictionConfig(["a"], single_ttl=5),
    )
    with patch("time.time", return_value=HOUR * 100 + 10):
        expiry, threshold = module(_feature([3]))
    assert expiry.tolist() == [105, 105, 105] and expiry.dtype == torch.int32
    assert threshold == 100


def test_per_feature_ttl_follows_each_features_ids():
    config = HashZchEvictionConfig(["a", "b"], per_feature_ttl=[1, 24])
    module = HashZchEvictionModule(
        HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION, torch.device("cpu"), config
    )
    with patch("time.time", return_value=HOUR * 10):
        expiry, _ = module(_feature([2, 1]))
    assert expiry.tolist() == [11, 11, 34]


def test_a_ttl_policy_without_config_is_refused():
    with pytest.raises(ValueError, match="needs an eviction_config"):
        HashZchEvictionModule(HashZchEvictionPolicyName.SINGLE_TTL_EVICTION, torch.device("cpu"), None)


def test_only_lru_selects_the_kernels_lru_policy():
    assert get_kernel_from_policy(HashZchEvictionPolicyName.LRU_EVICTION) == 1
    assert get_kernel_from_policy(HashZchEvictionPolicyName.SINGLE_TTL_EVICTION) == 0
    assert get_kernel_from_policy(None) == 0
