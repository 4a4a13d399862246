"""Data-parallel tables of a collection built TorchRec's way: TorchRec's ``dense`` compute kernel.

A collection built without ``fused_optimizer=`` has tables that are parameters with gradients. Its
data-parallel tables stay so once sharded, as in TorchRec: every rank holds a full copy, looks up its own
batch, DDP all-reduces (averages) the dense gradients, and the user's optimizer steps the tables (they carry
no in-backward optimizer, so ``in_backward_optimizer_filter`` yields them).
``data_parallel.DataParallelTables`` is the fused counterpart that ``fused_optimizer=`` collections use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.embedding.dense_tables import dense_bags, dense_pooled
from rectrain.embedding.feature_routing import KJTLike


class DenseDataParallelTables(nn.Module):
    """Replicated trainable tables of a sharded collection; ``embedding_names`` in output column order."""

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        embedding_names: Mapping[str, list[str]],
        is_weighted: bool,
        device: torch.device,
    ) -> None:
        super().__init__()
        self._configs = list(tables)
        self.tables = dense_bags(self._configs, is_weighted, device)
        self.embedding_names = [n for t in self._configs for n in embedding_names[t.name]]

    def weight(self, table: str) -> Tensor:
        return self.tables[table].weight

    def forward(self, features: KJTLike, weighted: bool) -> Tensor:
        """This rank's ``[batch, dims]`` pooled output, columns in ``embedding_names`` order."""
        return dense_pooled(self.tables, self._configs, features, weighted)
