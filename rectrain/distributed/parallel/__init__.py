"""DistributedModelParallel and its inputs: sharders, fused params, hand-written plans, kernel agreement."""
