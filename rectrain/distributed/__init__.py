"""Distributed training: DistributedModelParallel, sharded collections, process groups and collectives."""

from rectrain.distributed.comm.env import ShardingEnv, default_backend, init_from_env, intra_and_cross_node_pg
from rectrain.distributed.parallel.model_parallel import DistributedModelParallel
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
    "ShardingType",
    "TrainPipelineBase",
    "TrainPipelineSparseDist",
    "ShardingEnv",
    "default_backend",
    "init_from_env",
    "intra_and_cross_node_pg",
]
