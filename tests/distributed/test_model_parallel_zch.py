"""DistributedModelParallel refuses a model with managed-collision remappers (not sharded yet) by name,
instead of leaving each rank to remap its own batch with its own state."""

from __future__ import annotations

import torch
from torch import nn

from rectrain.distributed import DistributedModelParallel
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.errors import ConfigError
from rectrain.zch.collection import ManagedCollisionCollection
from rectrain.zch.embedding import ManagedCollisionEmbeddingBagCollection
from rectrain.zch.eviction import LFU_EvictionPolicy
from rectrain.zch.mch import MCHManagedCollisionModule
from tests.distributed.multiprocess import run_multiprocess


def _refusal(env) -> str:
    tables = [EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=4, feature_names=["f"])]
    remapper = MCHManagedCollisionModule(
        zch_size=8, device=torch.device("cpu"), eviction_policy=LFU_EvictionPolicy(), eviction_interval=1
    )
    model = nn.Sequential(
        ManagedCollisionEmbeddingBagCollection(
            EmbeddingBagCollection(tables=tables), ManagedCollisionCollection({"t": remapper}, tables)
        )
    )
    try:
        DistributedModelParallel(model, env=env, device=torch.device("cpu"))
    except ConfigError as error:
        return str(error)
    return "sharded"


def test_managed_collision_models_are_refused_by_name():
    message = "managed-collision module at '0._managed_collision_collection._managed_collision_modules.t'"
    assert all(message in result for result in run_multiprocess(_refusal, 2))


def test_torchrecs_managed_collision_sharders_plan_row_wise_only():
    from rectrain.distributed.mc_embedding import ManagedCollisionEmbeddingCollectionSharder
    from rectrain.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
    from rectrain.distributed.mc_modules import ManagedCollisionCollectionSharder

    for sharder in (
        ManagedCollisionCollectionSharder,
        ManagedCollisionEmbeddingBagCollectionSharder,
        ManagedCollisionEmbeddingCollectionSharder,
    ):
        # Built for planning (TorchRec's enumerator API); DMP refuses the modules they are for (above).
        assert sharder().sharding_types("cpu") == ["row_wise"]
        assert sharder().compute_kernels("row_wise", "cpu") == ["fused"]
