"""KeyedTensor builders for regroup tests, at TorchRec's path (``torchrec.sparse.tests.utils``)."""

from __future__ import annotations

import random

import torch

from rectrain.sparse.keyed_tensor import KeyedTensor


def build_kts(
    dense_features: int,
    sparse_features: int,
    dim_dense: int,
    dim_sparse: int,
    batch_size: int,
    device: torch.device,
    run_backward: bool,
) -> list[KeyedTensor]:
    """Two KeyedTensors of random [batch, dim] tensors: ``dense_<i>`` keys and ``sparse_<i>`` keys."""

    def keyed(prefix: str, count: int, dim: int) -> KeyedTensor:
        tensors = [
            torch.randn(batch_size, dim, device=device, requires_grad=run_backward) for _ in range(count)
        ]
        return KeyedTensor.from_tensor_list([f"{prefix}_{i}" for i in range(count)], tensors, key_dim=1)

    return [keyed("dense", dense_features, dim_dense), keyed("sparse", sparse_features, dim_sparse)]


def build_groups(
    kts: list[KeyedTensor], num_groups: int, skips: bool = False, duplicates: bool = False
) -> list[list[str]]:
    """Every key of ``kts`` put in a random group; ``skips`` drops one key from each group of two or more,
    ``duplicates`` adds a random key to every group."""
    keys = [key for kt in kts for key in kt.keys()]  # noqa: SIM118 (keys() is a list)
    groups: list[list[str]] = [[] for _ in range(num_groups)]
    for key in keys:
        groups[random.randrange(num_groups)].append(key)
    if skips:
        for group in groups:
            if len(group) > 1:
                group.pop(random.randrange(len(group)))
    if duplicates:
        for group in groups:
            group.append(random.choice(keys))
    return groups
