"""TorchRec's sharded-module interfaces (awaitables, ShardedModule, contexts, KJTList, kernel groups)."""
