"""Managed collision (ZCH): remapping unbounded ids into the rows of a fixed-size table.

TorchRec's ``modules.mc_modules``, ``mc_embedding_modules``, ``hash_mc_modules`` and ``hash_mc_evictions``
are re-exported at those paths under ``rectrain.modules``; the implementations live here:

- ``filters``: threshold functions that keep rare ids out of a table.
- ``eviction``: the MCH eviction policies (LFU, LRU, distance-weighted LFU).
- ``module``: ``ManagedCollisionModule``, the interface every remapper implements.
- ``mch``: ``MCHManagedCollisionModule``, the sorted-table remapper with periodic eviction.
- ``collection``: ``ManagedCollisionCollection``, one remapper per table over a KeyedJaggedTensor.
- ``embedding``: ``ManagedCollisionEmbedding(Bag)Collection``, remapping in front of a collection.
- ``hash_evictions`` / ``hash_zch``: multi-probe ZCH (MPZCH) on FBGEMM's ``zero_collision_hash`` op.
"""
