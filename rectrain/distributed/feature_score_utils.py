"""``torchrec.distributed.feature_score_utils``: which features carry eviction scores as KJT weights.

Feature scores feed the eviction of virtual (key-value) tables with a ``FeatureScoreBasedEvictionPolicy``;
rectrain refuses to shard virtual tables (it runs no key-value kernel), so with rectrain's tables the
collection is off and the features pass unchanged. The rules are TorchRec's, so sharding code that builds
the mapping ports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rectrain.modules.embedding_configs import FeatureScoreBasedEvictionPolicy
from rectrain.planner.types import ShardingType
from rectrain.sparse import KeyedJaggedTensor


def _policies(configs: Sequence[Any]) -> tuple[bool, bool]:
    """(weight accumulation on, auto collection on): all virtual tables with a policy must agree."""
    evicting = [c for c in configs if c.use_virtual_table and c.virtual_table_eviction_policy is not None]
    scored = [
        c for c in evicting if isinstance(c.virtual_table_eviction_policy, FeatureScoreBasedEvictionPolicy)
    ]
    if not scored:
        return False, False
    assert len(scored) == len(evicting), (
        "If any virtual table uses FeatureScoreBasedEvictionPolicy, all virtual tables with eviction "
        "policies must use FeatureScoreBasedEvictionPolicy"
    )
    auto = [c.virtual_table_eviction_policy.enable_auto_feature_score_collection for c in scored]
    assert all(auto) or not any(auto), (
        "If any virtual table has enable_auto_feature_score_collection=True, all virtual tables with "
        "FeatureScoreBasedEvictionPolicy must have enable_auto_feature_score_collection=True"
    )
    return True, any(auto)


def _scores(info: Any) -> dict[str, float]:
    config = info.embedding_config
    policy = config.virtual_table_eviction_policy
    if not isinstance(policy, FeatureScoreBasedEvictionPolicy):
        return {}
    if policy.eviction_ttl_mins > 0:  # evicted by age: the scores only mark the features
        return dict.fromkeys(config.feature_names, 0.0)
    mapping = policy.feature_score_mapping or {}
    missing = [f for f in config.feature_names if f not in mapping]
    assert not missing or policy.feature_score_default_value is not None, (
        f"Table {config.name} eviction policy feature_score_default_value is not set but feature "
        f"{missing[0]} is not in feature_score_mapping."
    )
    return {f: mapping.get(f, policy.feature_score_default_value) for f in config.feature_names}


def create_sharding_type_to_feature_score_mapping(
    embedding_configs: Sequence[Any], sharding_type_to_sharding_infos: dict[str, list[Any]]
) -> tuple[bool, bool, dict[str, dict[str, float]]]:
    """(weight accumulation on, auto collection on, sharding type -> feature -> score)."""
    accumulate, auto = _policies(embedding_configs)
    if not auto:
        return accumulate, auto, {}
    mapping = {
        sharding_type: {}
        if sharding_type == ShardingType.DATA_PARALLEL.value
        else {f: s for info in infos for f, s in _scores(info).items()}
        for sharding_type, infos in sharding_type_to_sharding_infos.items()
    }
    return accumulate, auto, mapping


@torch.fx.wrap
def may_collect_feature_scores(
    input_feature_splits: list[KeyedJaggedTensor],
    enabled_feature_score_auto_collection: bool,
    sharding_type_feature_score_mapping: dict[str, dict[str, float]],
) -> list[KeyedJaggedTensor]:
    """With auto collection on, each split's weights become its features' scores, one per value."""
    if not enabled_feature_score_auto_collection:
        return input_feature_splits
    for features, mapping in zip(input_feature_splits, sharding_type_feature_score_mapping.values()):
        assert features.weights_or_none() is None, f"Auto feature collection: {features.keys()=} has weights"
        if mapping:
            scores = [
                torch.full_like(features[f].values(), mapping.get(f, 0.0), dtype=torch.float32)
                for f in features.keys()  # noqa: SIM118 - a KeyedJaggedTensor's keys, not a dict's
            ]
            features._weights = torch.cat(scores) if scores else None
    return input_feature_splits
