"""``torchrec.distributed.sharding`` at rectrain's path."""
