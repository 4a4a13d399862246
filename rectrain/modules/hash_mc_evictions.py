"""``torchrec.modules.hash_mc_evictions`` at rectrain's path (in ``rectrain.zch.hash_evictions``)."""

from rectrain.zch.hash_evictions import (
    HashZchEvictionConfig,
    HashZchEvictionModule,
    HashZchEvictionPolicyName,
    HashZchEvictionScorer,
    HashZchOptEvictionModule,
    HashZchPerFeatureTtlScorer,
    HashZchSingleTtlScorer,
    HashZchThresholdEvictionModule,
    get_eviction_module,
    get_eviction_scorer,
    get_kernel_from_policy,
)

__all__ = [
    "HashZchEvictionConfig",
    "HashZchEvictionModule",
    "HashZchEvictionPolicyName",
    "HashZchEvictionScorer",
    "HashZchOptEvictionModule",
    "HashZchPerFeatureTtlScorer",
    "HashZchSingleTtlScorer",
    "HashZchThresholdEvictionModule",
    "get_eviction_module",
    "get_eviction_scorer",
    "get_kernel_from_policy",
]
