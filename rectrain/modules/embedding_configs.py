"""``torchrec.modules.embedding_configs`` at rectrain's path (implemented in ``rectrain.embedding``)."""

from dataclasses import dataclass

from rectrain.embedding.config import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbeddingTableConfig,
    EmbOptimType,
    FusedOptimizerConfig,
    PoolingType,
    QuantConfig,
    dtype_to_data_type,
)

__all__ = [
    "BaseEmbeddingConfig",
    "DataType",
    "EmbOptimType",
    "EmbeddingBagConfig",
    "EmbeddingConfig",
    "EmbeddingTableConfig",
    "FeatureScoreBasedEvictionPolicy",
    "FusedOptimizerConfig",
    "NoEvictionPolicy",
    "PoolingType",
    "QuantConfig",
    "VirtualTableEvictionPolicy",
    "dtype_to_data_type",
]


@dataclass
class VirtualTableEvictionPolicy:
    """TorchRec's eviction policy of a virtual (key-value) table. rectrain runs no key-value kernel (see
    ``EmbeddingComputeKernel.unsupported_reason``), so a policy describes a table it would refuse to shard."""

    meta_header_len: int = 0
    embedding_dim: int = 0
    initialized: bool = False


@dataclass
class NoEvictionPolicy(VirtualTableEvictionPolicy):
    """A virtual table that never evicts."""


@dataclass
class FeatureScoreBasedEvictionPolicy(VirtualTableEvictionPolicy):
    """A virtual table evicting ids by decayed feature scores (``eviction_ttl_mins`` > 0: by age instead);
    ``feature_score_mapping`` gives each feature's score, ``feature_score_default_value`` the others'."""

    decay_rate: float = 0.99
    training_id_eviction_trigger_count: int = 0
    training_id_keep_count: int = 0
    eviction_ttl_mins: int = 0
    max_inference_id_num_per_rank: int = 0
    inference_eviction_feature_score_threshold: float | None = None
    inference_eviction_ttl_mins: int | None = None
    feature_score_mapping: dict[str, float] | None = None
    feature_score_default_value: float | None = None
    enable_auto_feature_score_collection: bool = False
    enable_eviction: bool = True

    def __post_init__(self) -> None:  # TorchRec's defaults derived from the other fields
        if self.inference_eviction_feature_score_threshold is None:
            self.inference_eviction_feature_score_threshold = 0
        if self.inference_eviction_ttl_mins is None:
            self.inference_eviction_ttl_mins = self.eviction_ttl_mins
        if self.max_inference_id_num_per_rank == 0:
            self.max_inference_id_num_per_rank = self.training_id_keep_count
        if self.enable_auto_feature_score_collection and self.feature_score_mapping is None:
            self.feature_score_mapping = {}
