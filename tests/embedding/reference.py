"""Test oracle: the collections rebuilt from plain ``nn.EmbeddingBag`` / ``nn.Embedding``, one per table, and
random batches described per feature (so the oracle never goes through the KeyedJaggedTensor under test)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig
from rectrain.sparse import KeyedJaggedTensor


def fused_ebc(tables: list[EmbeddingBagConfig], *args, **kwargs) -> EmbeddingBagCollection:
    """An EmbeddingBagCollection on the fused FBGEMM path (row-wise Adagrad unless ``fused_optimizer=``)."""
    kwargs.setdefault("fused_optimizer", FusedOptimizerConfig())
    return EmbeddingBagCollection(tables, *args, **kwargs)


def fused_ec(tables: list[EmbeddingConfig], *args, **kwargs) -> EmbeddingCollection:
    """An EmbeddingCollection on the fused FBGEMM path (row-wise Adagrad unless ``fused_optimizer=``)."""
    kwargs.setdefault("fused_optimizer", FusedOptimizerConfig())
    return EmbeddingCollection(tables, *args, **kwargs)


@dataclass
class FeatureBatch:
    """Per feature: ids, bag lengths (one per example) and optional per-id weights."""

    ids: dict[str, Tensor]
    lengths: dict[str, Tensor]
    weights: dict[str, Tensor] | None
    batch_size: int

    def kjt(self, keys: list[str] | None = None) -> KeyedJaggedTensor:
        """The batch as a KJT with ``keys`` in that order (default: the batch's own order)."""
        keys = list(self.ids) if keys is None else keys
        weights = None if self.weights is None else torch.cat([self.weights[k] for k in keys])
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([self.ids[k] for k in keys]),
            weights=weights,
            lengths=torch.cat([self.lengths[k] for k in keys]),
        )

    def offsets(self, feature: str) -> Tensor:
        return torch.cat([torch.zeros(1, dtype=torch.int64), self.lengths[feature].cumsum(0)])


def random_batch(
    rows: dict[str, int],
    batch_size: int,
    gen: torch.Generator,
    max_len: int = 5,
    weighted: bool = False,
    empty_bags: bool = True,
) -> FeatureBatch:
    """Bag lengths uniform in [0 or 1, max_len]; ids uniform over each feature's table (``rows[feature]``)."""
    ids, lengths, weights = {}, {}, {}
    for feature, num_rows in rows.items():
        feature_lengths = torch.randint(0 if empty_bags else 1, max_len + 1, (batch_size,), generator=gen)
        count = int(feature_lengths.sum())
        lengths[feature] = feature_lengths
        ids[feature] = torch.randint(0, num_rows, (count,), generator=gen)
        weights[feature] = torch.rand(count, generator=gen)
    return FeatureBatch(ids, lengths, weights if weighted else None, batch_size)


class ReferenceEBC(nn.Module):
    """One ``nn.EmbeddingBag(sparse=True)`` per table; output columns in the collection's order."""

    def __init__(self, tables: list[EmbeddingBagConfig], weights: dict[str, Tensor]) -> None:
        super().__init__()
        self.tables = tables
        self.bags = nn.ModuleDict(
            {
                t.name: nn.EmbeddingBag.from_pretrained(
                    weights[t.name].detach().clone(), freeze=False, mode=t.pooling.value.lower(), sparse=True
                )
                for t in tables
            }
        )

    def forward(self, batch: FeatureBatch) -> Tensor:
        pooled = []
        for table in self.tables:
            for feature in table.feature_names:
                psw = None if batch.weights is None else batch.weights[feature]
                offsets = batch.offsets(feature)[:-1]
                pooled.append(self.bags[table.name](batch.ids[feature], offsets, per_sample_weights=psw))
        return torch.cat(pooled, dim=1)


class ReferenceEC(nn.Module):
    """One ``nn.Embedding(sparse=True)`` per table; per-feature ``[num ids, dim]`` outputs."""

    def __init__(self, tables: list[EmbeddingConfig], weights: dict[str, Tensor]) -> None:
        super().__init__()
        self.tables = tables
        self.embeddings = nn.ModuleDict(
            {
                t.name: nn.Embedding.from_pretrained(
                    weights[t.name].detach().clone(), freeze=False, sparse=True
                )
                for t in tables
            }
        )

    def forward(self, batch: FeatureBatch) -> list[Tensor]:
        return [
            self.embeddings[table.name](batch.ids[feature])
            for table in self.tables
            for feature in table.feature_names
        ]


def table_weights(module: nn.Module, prefix: str, tables: list) -> dict[str, Tensor]:
    """The collection's tables, read through its state dict."""
    state = module.state_dict()
    return {t.name: state[f"{prefix}.{t.name}.weight"] for t in tables}
