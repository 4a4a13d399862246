"""``torchrec.distributed.model_parallel`` at rectrain's path (the engine: ``parallel/model_parallel.py``)."""

from typing import Any

from rectrain.distributed.parallel.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)
from rectrain.errors import ConfigError

__all__ = ["DMPCollection", "DataParallelWrapper", "DefaultDataParallelWrapper", "DistributedModelParallel"]


class DMPCollection(DistributedModelParallel):
    """TorchRec's 2D parallelism (a model sharded within groups of ranks, replicated across them): refused."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ConfigError(
            "DMPCollection (2D parallelism) is not supported: rectrain shards a model over the whole world; "
            "use DistributedModelParallel"
        )
