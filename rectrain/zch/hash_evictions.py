"""Eviction of multi-probe ZCH (``torchrec.modules.hash_mc_evictions``).

FBGEMM's ``zero_collision_hash`` kernel decides evictions while it probes: a slot whose stored expiry (the
"metadata", in hours since the epoch) is below the threshold may be taken by a new id. The modules here give
the kernel each id's expiry and the current threshold: a single TTL for every feature, one TTL per feature,
or LRU (the kernel's other policy, which also reads the single TTL's expiry).
"""

import logging
import time
from dataclasses import dataclass
from enum import Enum, unique

import torch
from torch import Tensor

from rectrain.sparse import JaggedTensor

logger = logging.getLogger(__name__)


@unique
class HashZchEvictionPolicyName(Enum):
    SINGLE_TTL_EVICTION = "SINGLE_TTL_EVICTION"  # evictable once older than one TTL
    PER_FEATURE_TTL_EVICTION = "PER_FEATURE_TTL_EVICTION"  # each feature its own TTL
    LRU_EVICTION = "LRU_EVICTION"  # the least recently seen id within the probe range


@torch.jit.script
@dataclass
class HashZchEvictionConfig:
    """The features of a table and their TTLs in hours (``single_ttl`` or one per feature)."""

    features: list[str]
    single_ttl: int | None = None
    per_feature_ttl: list[int] | None = None


@torch.fx.wrap
def get_kernel_from_policy(policy_name: HashZchEvictionPolicyName | None) -> int:
    """The kernel's ``eviction_policy`` argument: 1 for LRU, 0 for the TTL policies (and none)."""
    return 1 if policy_name is not None and policy_name == HashZchEvictionPolicyName.LRU_EVICTION else 0


def _hours_now() -> int:
    return int(time.time() / 3600)


class HashZchEvictionScorer:
    """No scores, no threshold: the kernel never evicts."""

    def __init__(self, config: HashZchEvictionConfig) -> None:
        self._config: HashZchEvictionConfig = config

    def gen_score(self, feature: JaggedTensor, device: torch.device) -> Tensor:
        return torch.empty(0, device=device)

    def gen_threshold(self) -> int:
        return -1


class HashZchSingleTtlScorer(HashZchEvictionScorer):
    """Every id expires ``single_ttl`` hours from now."""

    def gen_score(self, feature: JaggedTensor, device: torch.device) -> Tensor:
        ttl = self._config.single_ttl
        assert ttl is not None, "SINGLE_TTL_EVICTION (and LRU_EVICTION) need HashZchEvictionConfig.single_ttl"
        return torch.full_like(feature.values(), ttl + _hours_now(), dtype=torch.int32, device=device)

    def gen_threshold(self) -> int:
        return _hours_now()


class HashZchPerFeatureTtlScorer(HashZchEvictionScorer):
    """Each id expires its feature's TTL from now (``feature.weights()`` holds the ids per feature)."""

    def __init__(self, config: HashZchEvictionConfig) -> None:
        super().__init__(config)
        ttls = config.per_feature_ttl
        assert ttls is not None and len(config.features) == len(ttls), (
            "PER_FEATURE_TTL_EVICTION needs one per_feature_ttl for each of HashZchEvictionConfig.features"
        )
        self._per_feature_ttl = torch.IntTensor(ttls)

    def gen_score(self, feature: JaggedTensor, device: torch.device) -> Tensor:
        ids_per_feature = feature.weights()
        assert ids_per_feature.size(0) == self._per_feature_ttl.size(0)
        expiry = self._per_feature_ttl.repeat_interleave(ids_per_feature) + _hours_now()
        return expiry.to(device=device)

    def gen_threshold(self) -> int:
        return _hours_now()


@torch.fx.wrap
def get_eviction_scorer(
    policy_name: HashZchEvictionPolicyName, config: HashZchEvictionConfig
) -> HashZchEvictionScorer:
    if policy_name in (HashZchEvictionPolicyName.SINGLE_TTL_EVICTION, HashZchEvictionPolicyName.LRU_EVICTION):
        return HashZchSingleTtlScorer(config)
    if policy_name == HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION:
        return HashZchPerFeatureTtlScorer(config)
    return HashZchEvictionScorer(config)


class HashZchThresholdEvictionModule(torch.nn.Module):
    """``forward(feature, device)`` -> (each id's expiry, the eviction threshold) under ``policy_name``."""

    _eviction_scorer: HashZchEvictionScorer

    def __init__(self, policy_name: HashZchEvictionPolicyName, config: HashZchEvictionConfig) -> None:
        super().__init__()
        self._policy_name: HashZchEvictionPolicyName = policy_name
        self._config: HashZchEvictionConfig = config
        self._eviction_scorer = get_eviction_scorer(policy_name=policy_name, config=config)
        logger.info("HashZchThresholdEvictionModule: %s, %s", policy_name, config)

    def forward(self, feature: JaggedTensor, device: torch.device) -> tuple[Tensor, int]:
        return self._eviction_scorer.gen_score(feature, device), self._eviction_scorer.gen_threshold()


class HashZchOptEvictionModule(torch.nn.Module):
    """A policy that needs no per-id input: ``forward`` gives (None, -1)."""

    def __init__(self, policy_name: HashZchEvictionPolicyName) -> None:
        super().__init__()
        self._policy_name: HashZchEvictionPolicyName = policy_name

    def forward(self, feature: JaggedTensor, device: torch.device) -> tuple[None, int]:
        return None, -1


@torch.fx.wrap
def get_eviction_module(
    policy_name: HashZchEvictionPolicyName, config: HashZchEvictionConfig | None
) -> torch.nn.Module:
    if policy_name in (
        HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
        HashZchEvictionPolicyName.PER_FEATURE_TTL_EVICTION,
        HashZchEvictionPolicyName.LRU_EVICTION,
    ):
        if config is None:
            raise ValueError(
                f"eviction policy {policy_name.name} needs an eviction_config (HashZchEvictionConfig)"
            )
        return HashZchThresholdEvictionModule(policy_name, config)
    return HashZchOptEvictionModule(policy_name)


class HashZchEvictionModule(torch.nn.Module):
    """The eviction inputs of a ``HashZchManagedCollisionModule``: ``forward(feature)`` -> (expiries or None,
    threshold)."""

    def __init__(
        self,
        policy_name: HashZchEvictionPolicyName,
        device: torch.device,
        config: HashZchEvictionConfig | None,
    ) -> None:
        super().__init__()
        self._policy_name: HashZchEvictionPolicyName = policy_name
        self._device: torch.device = device
        self._eviction_module: torch.nn.Module = get_eviction_module(self._policy_name, config)
        logger.info("HashZchEvictionModule: %s on %s", policy_name, device)

    def forward(self, feature: JaggedTensor) -> tuple[Tensor | None, int]:
        return self._eviction_module(feature, self._device)
