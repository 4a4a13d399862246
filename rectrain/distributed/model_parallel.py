"""``torchrec.distributed.model_parallel`` at rectrain's path (the engine: ``parallel/model_parallel.py``)."""

from rectrain.distributed.parallel.model_parallel import (
    DataParallelWrapper,
    DefaultDataParallelWrapper,
    DistributedModelParallel,
)

__all__ = ["DataParallelWrapper", "DefaultDataParallelWrapper", "DistributedModelParallel"]
