"""The checkpoint tests' small DLRM with its two larger tables on disk (or in RAM, the reference)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import FusedOptimizerConfig
from rectrain.models import DLRM, DLRMTrain
from tests.checkpoint import common

CACHE = 4096  # one page resident per kernel: every table is larger than its cache


def build(storage: str, seed: int = 0, optimizer: str = "adagrad") -> DLRMTrain:
    torch.manual_seed(seed)
    tables = [dataclasses.replace(t, storage=storage) if t.name != "t2" else t for t in common.tables()]
    ebc = EmbeddingBagCollection(tables, fused_optimizer=FusedOptimizerConfig(optimizer, lr=0.05))
    return DLRMTrain(DLRM(ebc, common.DENSE_IN, [16, common.DIM], [16, 1]))


make_optimizer = common.make_optimizer


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    common.train(model, optimizer, steps, rank=0)
