"""Distributed training: DistributedModelParallel, sharded collections, process groups and collectives."""

from rectrain.distributed.comm import (
    all_gather_v,
    all_reduce_coalesced,
    all_to_all_single,
    all_to_all_with_splits,
    alltoall_pooled,
    exchange_splits,
    reduce_scatter_v_pooled,
)
from rectrain.distributed.env import ShardingEnv, default_backend, init_from_env, intra_and_cross_node_pg
from rectrain.distributed.model_parallel import DistributedModelParallel
from rectrain.distributed.pending import Pending
from rectrain.distributed.sharded_embedding import ShardedEmbeddingCollection
from rectrain.distributed.sharded_embedding_bag import ShardedEmbeddingBagCollection
from rectrain.distributed.sharded_table import ShardedTable
from rectrain.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from rectrain.planner.types import ShardingType


def __getattr__(name: str) -> object:
    # TorchRec exports its pipelines from torchrec.distributed; ours live in rectrain.train.pipeline, which
    # imports this package, so they are resolved on first use rather than at import.
    if name in ("TrainPipelineBase", "TrainPipelineSparseDist"):
        from rectrain.train import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DistributedModelParallel",
    "Pending",
    "ShardedEmbeddingBagCollection",
    "ShardedEmbeddingCollection",
    "ShardedTable",
    "ShardingType",
    "TrainPipelineBase",
    "TrainPipelineSparseDist",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "row_wise",
    "table_row_wise",
    "table_wise",
    "ShardingEnv",
    "all_gather_v",
    "all_reduce_coalesced",
    "all_to_all_single",
    "all_to_all_with_splits",
    "alltoall_pooled",
    "default_backend",
    "exchange_splits",
    "init_from_env",
    "intra_and_cross_node_pg",
    "reduce_scatter_v_pooled",
]
