"""``torchrec.distributed.test_utils.test_model``: small SparseNN models for sharding and planner tests.

The models have TorchRec's structure (module names and paths, which tables sit where), so a test that plans
or shards one sees the same module tree as under TorchRec: ``TestSparseNN`` (a dense arch, a sparse arch of
an unweighted and a weighted ``EmbeddingBagCollection``, an over arch), ``TestTowerSparseNN`` (two
``EmbeddingTower`` s beside a sparse arch) and ``TestTowerCollectionSparseNN`` (three towers in an
``EmbeddingTowerCollection``). The layers are rectrain's own. TorchRec's variants that need modules rectrain
lacks (feature-processed collections, managed-collision arches, sequence arches) are refused by argument.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rectrain.distributed.test_utils.model_input import ModelInput
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.errors import ConfigError
from rectrain.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection
from rectrain.sparse import KeyedJaggedTensor, KeyedTensor

DENSE_LAYER_OUT_SIZE = 8
OVER_ARCH_OUT_SIZE = 16


def _width(tables: list[EmbeddingBagConfig]) -> int:
    return sum(table.embedding_dim * len(table.feature_names) for table in tables)


def _loss_or_pred(module: nn.Module, logits: torch.Tensor, label: torch.Tensor) -> Any:
    pred = torch.sigmoid(torch.mean(logits, dim=1))
    if module.training:
        return nn.functional.binary_cross_entropy_with_logits(pred, label), pred
    return pred


class TestDenseArch(nn.Module):
    """Dense features -> ``dense_arch_out_size`` through optional hidden layers and a final Linear."""

    __test__ = False  # a model, not a pytest test class

    def __init__(
        self,
        num_float_features: int,
        device: torch.device | None = None,
        dense_arch_out_size: int | None = None,
        dense_arch_hidden_sizes: list[int] | None = None,
        **_kwargs: Any,
    ) -> None:
        super().__init__()
        device = device or torch.device("cpu")
        sizes = [num_float_features, *(dense_arch_hidden_sizes or [])]
        hidden = [nn.Linear(a, b, device=device) for a, b in zip(sizes, sizes[1:])]
        self.hidden_layers = nn.ModuleList(hidden) if hidden else None
        self.linear = nn.Linear(sizes[-1], dense_arch_out_size or DENSE_LAYER_OUT_SIZE, device=device)

    def forward(self, dense_input: torch.Tensor) -> torch.Tensor:
        for layer in self.hidden_layers or []:
            dense_input = layer(dense_input)
        return self.linear(dense_input)


class TestOverArch(nn.Module):
    """Concatenates the dense output with the sparse embeddings (unweighted features, then weighted) and
    applies two Linear layers."""

    __test__ = False  # a model, not a pytest test class

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        weighted_tables: list[EmbeddingBagConfig],
        embedding_names: list[str] | None = None,
        device: torch.device | None = None,
        dense_arch_out_size: int | None = None,
        over_arch_out_size: int | None = None,
        **_kwargs: Any,
    ) -> None:
        super().__init__()
        device = device or torch.device("cpu")
        self._embedding_names = embedding_names or [f for t in tables for f in t.feature_names]
        self._weighted_features = [f for t in weighted_tables for f in t.feature_names]
        width = (dense_arch_out_size or DENSE_LAYER_OUT_SIZE) + _width(tables + weighted_tables)
        out = over_arch_out_size or OVER_ARCH_OUT_SIZE
        self.dhn_arch = nn.Sequential(
            nn.Linear(width, out, device=device), nn.Linear(out, out, device=device)
        )

    def forward(self, dense: torch.Tensor, sparse: KeyedTensor) -> torch.Tensor:
        groups = [g for g in (self._embedding_names, self._weighted_features) if g]
        return self.dhn_arch(torch.cat([dense, *KeyedTensor.regroup([sparse], groups)], dim=1))


class TestEBCSparseArch(nn.Module):
    """An unweighted ``ebc`` and, with weighted tables, a ``weighted_ebc``; outputs one KeyedTensor."""

    __test__ = False  # a model, not a pytest test class

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        weighted_tables: list[EmbeddingBagConfig],
        device: torch.device | None = None,
        max_feature_lengths: dict[str, int] | None = None,
        **_kwargs: Any,
    ) -> None:
        super().__init__()
        if max_feature_lengths is not None:
            raise ConfigError(
                "TestEBCSparseArch(max_feature_lengths=...): rectrain has no feature-processed collections"
            )
        device = device or torch.device("cpu")
        self.ebc = EmbeddingBagCollection(tables=tables, device=device)
        self.weighted_ebc = (
            EmbeddingBagCollection(tables=weighted_tables, is_weighted=True, device=device)
            if weighted_tables
            else None
        )

    def forward(
        self,
        features: KeyedJaggedTensor,
        weighted_features: KeyedJaggedTensor | None = None,
        batch_size: int | None = None,
    ) -> KeyedTensor:
        outputs = [self.ebc(features)]
        if self.weighted_ebc is not None and weighted_features is not None:
            outputs.append(self.weighted_ebc(weighted_features))
        return KeyedTensor(
            keys=[k for kt in outputs for k in kt.keys()],  # noqa: SIM118 (a KeyedTensor, not a dict)
            length_per_key=[n for kt in outputs for n in kt.length_per_key()],
            values=torch.cat([kt.values() for kt in outputs], dim=1),
        )


class TestSparseNNBase(nn.Module):
    """Records the dense and sparse devices (cpu unless given)."""

    __test__ = False  # a model, not a pytest test class

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        weighted_tables: list[EmbeddingBagConfig] | None = None,
        embedding_groups: dict[str, list[str]] | None = None,
        dense_device: torch.device | None = None,
        sparse_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.dense_device = dense_device or torch.device("cpu")
        self.sparse_device = sparse_device or torch.device("cpu")


class TestSparseNN(TestSparseNNBase):
    """``dense`` -> ``over`` on the dense output and the ``sparse`` arch's embeddings; ``forward(ModelInput)``
    returns ``(loss, pred)`` in training, ``pred`` in eval."""

    __test__ = False  # a model, not a pytest test class

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        num_float_features: int = 10,
        weighted_tables: list[EmbeddingBagConfig] | None = None,
        embedding_groups: dict[str, list[str]] | None = None,
        dense_device: torch.device | None = None,
        sparse_device: torch.device | None = None,
        max_feature_lengths: dict[str, int] | None = None,
        feature_processor_modules: dict[str, nn.Module] | None = None,
        over_arch_clazz: type[nn.Module] | None = None,
        postproc_module: nn.Module | None = None,
        zch_kwargs: dict[str, Any] | None = None,
        submodule_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(tables, weighted_tables, embedding_groups, dense_device, sparse_device)
        refused = {"feature_processor_modules": feature_processor_modules, "zch_kwargs": zch_kwargs}
        refused = {k: v for k, v in refused.items() if v is not None}
        if refused or any(not isinstance(t, EmbeddingBagConfig) for t in tables):
            what = ", ".join(refused) or "EmbeddingConfig tables (a sequence arch)"
            raise ConfigError(f"TestSparseNN: {what} need TorchRec modules rectrain does not have")
        weighted_tables = weighted_tables or []
        extra = submodule_kwargs or {}
        self.dense = TestDenseArch(num_float_features, device=dense_device, **extra)
        self.sparse = TestEBCSparseArch(tables, weighted_tables, sparse_device, max_feature_lengths, **extra)
        names = list(embedding_groups.values())[0] if embedding_groups else None
        self.over = (over_arch_clazz or TestOverArch)(tables, weighted_tables, names, dense_device, **extra)
        self.register_buffer("dummy_ones", torch.ones(1, device=dense_device))
        self.postproc_module = postproc_module

    def sparse_forward(self, input: ModelInput) -> KeyedTensor:
        return self.sparse(input.idlist_features, input.idscore_features, input.float_features.size(0))

    def dense_forward(self, input: ModelInput, sparse_output: KeyedTensor) -> Any:
        logits = self.over(self.dense(input.float_features), sparse_output)
        pred = torch.sigmoid(torch.mean(logits, dim=1)) + self.dummy_ones
        if self.training:
            return nn.functional.binary_cross_entropy_with_logits(pred, input.label), pred
        return pred

    def forward(self, input: ModelInput) -> Any:
        if self.postproc_module is not None:
            input = self.postproc_module(input)
        return self.dense_forward(input, self.sparse_forward(input))


class TestTowerInteraction(nn.Module):
    """A tower's interaction: its features' pooled embeddings, concatenated, through one Linear."""

    __test__ = False  # a model, not a pytest test class

    def __init__(self, tables: list[EmbeddingBagConfig], device: torch.device | None = None) -> None:
        super().__init__()
        self._features = [f for t in tables for f in t.feature_names]
        width = _width(tables)
        self.linear = nn.Linear(width, width, device=device or torch.device("cpu"))

    def forward(self, sparse: KeyedTensor) -> torch.Tensor:
        return self.linear(torch.cat([sparse[f] for f in self._features], dim=1))


def _tower(tables: list[EmbeddingBagConfig], is_weighted: bool = False) -> EmbeddingTower:
    return EmbeddingTower(
        embedding_module=EmbeddingBagCollection(tables=tables, is_weighted=is_weighted),
        interaction_module=TestTowerInteraction(tables=tables),
    )


class TestTowerSparseNN(TestSparseNNBase):
    """``tower_0`` (tables 2 and 3), ``tower_1`` (table 0) and a ``sparse_arch`` of table 1 and weighted
    table 0, all fed to ``over`` with the dense output. Needs 4 tables and 1 weighted table."""

    __test__ = False  # a model, not a pytest test class

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        num_float_features: int = 10,
        weighted_tables: list[EmbeddingBagConfig] | None = None,
        embedding_groups: dict[str, list[str]] | None = None,
        dense_device: torch.device | None = None,
        sparse_device: torch.device | None = None,
        feature_processor_modules: dict[str, nn.Module] | None = None,
    ) -> None:
        super().__init__(tables, weighted_tables, embedding_groups, dense_device, sparse_device)
        if len(tables) < 4 or not weighted_tables:
            raise ConfigError("TestTowerSparseNN needs at least 4 tables and 1 weighted table")
        self.dense = TestDenseArch(num_float_features, device=dense_device)
        self.tower_0 = _tower([tables[2], tables[3]])
        self.tower_1 = _tower([tables[0]])
        self.sparse_arch = TestEBCSparseArch([tables[1]], [weighted_tables[0]], sparse_device)
        self.sparse_arch_feature_names = tables[1].feature_names + weighted_tables[0].feature_names
        width = (
            DENSE_LAYER_OUT_SIZE
            + self.tower_0.interaction.linear.out_features
            + self.tower_1.interaction.linear.out_features
            + _width([tables[1], weighted_tables[0]])
        )
        self.over = nn.Linear(width, OVER_ARCH_OUT_SIZE, device=dense_device)

    def forward(self, input: ModelInput) -> Any:
        features = input.idlist_features
        sparse = self.sparse_arch(features, input.idscore_features)
        parts = [
            self.dense(input.float_features),
            self.tower_0(features),
            self.tower_1(features),
            *[sparse[f] for f in self.sparse_arch_feature_names],
        ]
        return _loss_or_pred(self, self.over(torch.cat(parts, dim=1)), input.label)


class TestTowerCollectionSparseNN(TestSparseNNBase):
    """A ``tower_arch`` collection of three towers (tables 0 and 2; table 1; weighted table 0) fed to
    ``over`` with the dense output."""

    __test__ = False  # a model, not a pytest test class

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        num_float_features: int = 10,
        weighted_tables: list[EmbeddingBagConfig] | None = None,
        embedding_groups: dict[str, list[str]] | None = None,
        dense_device: torch.device | None = None,
        sparse_device: torch.device | None = None,
        feature_processor_modules: dict[str, nn.Module] | None = None,
    ) -> None:
        super().__init__(tables, weighted_tables, embedding_groups, dense_device, sparse_device)
        if len(tables) < 3 or not weighted_tables:
            raise ConfigError("TestTowerCollectionSparseNN needs at least 3 tables and 1 weighted table")
        self.dense = TestDenseArch(num_float_features, device=dense_device)
        towers = [
            _tower([tables[0], tables[2]]),
            _tower([tables[1]]),
            _tower([weighted_tables[0]], is_weighted=True),
        ]
        self.tower_arch = EmbeddingTowerCollection(towers=towers)
        width = DENSE_LAYER_OUT_SIZE + sum(t.interaction.linear.out_features for t in towers)
        self.over = nn.Linear(width, OVER_ARCH_OUT_SIZE, device=dense_device)

    def forward(self, input: ModelInput) -> Any:
        sparse = self.tower_arch(input.idlist_features, input.idscore_features)
        logits = self.over(torch.cat([self.dense(input.float_features), sparse], dim=1))
        return _loss_or_pred(self, logits, input.label)
