"""Builders from a ``ModelConfig`` to modules: the prediction module (served) and its training wrapper.

Every kind's prediction module has the same contract and the same state-dict prefix, so checkpointing,
export and serving need not know the kind:

  prediction  ``forward(dense_features [B, dense_in_features], sparse_features KJT) -> logits [B]``;
              one child ``model`` holding the TorchRec architecture, so keys are ``model.`` + TorchRec's:
              ``dlrm``, ``dlrm_dcn``  ``model.sparse_arch.embedding_bag_collection.embedding_bags.<t>.weight``
              ``two_tower``          ``model.ebc.embedding_bags.<t>.weight``
  training    ``forward(batch) -> (loss, (loss, logits [B], labels))``; its child ``model`` is the
              prediction module (``.prediction_model``), so training keys are ``model.`` + prediction keys.
"""

from __future__ import annotations

import torch
from torch import nn

from rectrain.embedding import EmbeddingBagCollection, FusedOptimizerConfig
from rectrain.models.config import ModelConfig
from rectrain.models.dlrm import DLRM, DLRM_DCN, DLRMPrediction, DLRMTrain
from rectrain.models.two_tower import TwoTower, TwoTowerPrediction, TwoTowerTrainTask

PREDICTION_PREFIX = "model."


def _two_tower(cfg: ModelConfig, ebc: EmbeddingBagCollection, device: torch.device | str | None) -> TwoTower:
    query, candidate = cfg.tower_features()
    return TwoTower(
        ebc, cfg.tower_layer_sizes, device=device, query_features=query, candidate_features=candidate
    )


def _architecture(
    cfg: ModelConfig,
    fused_optimizer: FusedOptimizerConfig | None,
    device: torch.device | str | None,
    embedding_device: torch.device | str | None = None,
) -> nn.Module:
    """The TorchRec-named architecture of ``cfg`` (DLRM, DLRM_DCN or TwoTower) on ``device``."""
    tables_on = embedding_device if embedding_device is not None else device
    ebc = EmbeddingBagCollection(list(cfg.tables), device=tables_on, fused_optimizer=fused_optimizer)
    if cfg.kind == "two_tower":
        return _two_tower(cfg, ebc, device)
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.dense_in_features,
        dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
        dense_device=device,
    )
    if cfg.kind == "dlrm_dcn":
        return DLRM_DCN(**common, dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim)
    assert cfg.kind == "dlrm", cfg.kind  # ModelConfig.validate admits only the three kinds
    return DLRM(**common)


def build_model(
    cfg: ModelConfig,
    *,
    fused_optimizer: FusedOptimizerConfig | None = None,
    device: torch.device | str | None = None,
    embedding_device: torch.device | str | None = None,
) -> nn.Module:
    """The prediction module of ``cfg``: ``forward(dense, kjt) -> logits [B]`` (see the module docstring).

    ``fused_optimizer`` is the embedding tables' fused optimizer (default none: TorchRec's trainable tables);
    ``device`` holds tables and dense layers (default cpu), ``embedding_device`` the tables when it differs
    (``"meta"``: described, not allocated, for ``DistributedModelParallel``). The module has exactly one
    ``EmbeddingBagCollection``, which ``DistributedModelParallel`` shards.
    """
    cfg.validate()
    arch = _architecture(cfg, fused_optimizer, device, embedding_device)
    if cfg.kind == "two_tower":
        return TwoTowerPrediction(arch)
    return DLRMPrediction(arch)


def build_train_model(
    cfg: ModelConfig,
    *,
    fused_optimizer: FusedOptimizerConfig | None = None,
    device: torch.device | str | None = None,
    temperature: float = 1.0,
    embedding_device: torch.device | str | None = None,
) -> nn.Module:
    """The training module of ``cfg``, wrapping a fresh ``build_model(cfg, ...)`` as its child ``model``.

    ``dlrm`` / ``dlrm_dcn``: ``DLRMTrain`` (binary cross entropy). ``two_tower``: ``TwoTowerTrainTask``
    (in-batch softmax with ``temperature``). Both expose ``.prediction_model``.
    """
    prediction = build_model(
        cfg, fused_optimizer=fused_optimizer, device=device, embedding_device=embedding_device
    )
    if isinstance(prediction, TwoTowerPrediction):
        return TwoTowerTrainTask(prediction.model, temperature=temperature)
    return DLRMTrain(prediction)
