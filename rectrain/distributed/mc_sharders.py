"""TorchRec's managed-collision sharders, named and refused: ``DistributedModelParallel`` does not shard
managed-collision modules yet (see ``model_parallel.refuse_managed_collision``). A TorchRec script that builds
one stops here with the reason, not at an import or later with ranks whose rows mean different ids."""

from typing import Any

from rectrain.errors import ConfigError


class _NotShardedYet:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(
            f"{type(self).__name__}: rectrain does not shard managed-collision modules yet (TorchRec shards "
            "remappers row-wise with their tables); train the model unsharded"
        )


class ManagedCollisionCollectionSharder(_NotShardedYet):
    """``torchrec.distributed.mc_modules.ManagedCollisionCollectionSharder`` (refused when built)."""


class ManagedCollisionEmbeddingBagCollectionSharder(_NotShardedYet):
    """``torchrec.distributed.mc_embeddingbag.ManagedCollisionEmbeddingBagCollectionSharder`` (refused)."""


class ManagedCollisionEmbeddingCollectionSharder(_NotShardedYet):
    """``torchrec.distributed.mc_embedding.ManagedCollisionEmbeddingCollectionSharder`` (refused)."""
