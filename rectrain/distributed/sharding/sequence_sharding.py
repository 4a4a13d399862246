"""``torchrec.distributed.sharding.sequence_sharding`` at rectrain's path: the sequence sharding context."""

from rectrain.distributed.interfaces.contexts import SequenceShardingContext

__all__ = ["SequenceShardingContext"]
