"""``torchrec.distributed.shard`` at rectrain's path (the engine: ``parallel/module_sharding.py``).

``shard(ebc, plan)`` returns the sharded collection; ``shard_modules(model)`` shards the model's collections
in place (no DDP around the rest: that is ``DistributedModelParallel``). Plans are TorchRec's forms: a module
plan, a generator per table (``{"t1": table_wise(rank=0)}``) or one generator (``row_wise()``); ``env``
defaults to the default process group, ``device`` to ``cuda:<local rank>`` if CUDA, else cpu.
"""

from rectrain.distributed.parallel.module_sharding import shard_module as shard
from rectrain.distributed.parallel.module_sharding import shard_submodules as shard_modules

_shard_modules = shard_modules  # TorchRec's name of the same entry point (its tests import it)

__all__ = ["_shard_modules", "shard", "shard_modules"]
