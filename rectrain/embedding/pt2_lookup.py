"""The collections' lookups in plain PyTorch ops, for ``torch.compile`` and ``torch.export``.

FBGEMM's training TBE cannot be traced by the PT2 tracers (its CPU lookup has no fake-tensor kernel and its
Python wrapper reads tensor values). While a PT2 tracer runs, the collections therefore look their tables up
with ``embedding_bag``/``embedding`` over the very same weights (``embedding_bags.<table>.weight`` alias the
TBE storage), as TorchRec's unsharded modules do: the outputs are the same. What the traced program does not
do is run the fused optimizer: the tables receive no update from its backward (see docs/torchrec.md,
"Differences from TorchRec"). Eager calls and ``torch.fx`` graphs keep the FBGEMM path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rectrain.embedding.config import BaseEmbeddingConfig, PoolingType
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor


def pooled(
    tables: nn.ModuleDict, configs: Sequence[BaseEmbeddingConfig], features: KeyedJaggedTensor, weighted: bool
) -> Tensor:
    """``[B, sum of dims]``: each table's features in order, pooled (SUM, MEAN; weighted by the KJT's
    weights when ``weighted``), concatenated in table order."""
    jts = features.to_dict()
    columns = []
    for table in configs:
        weight = tables[table.name].weight
        for name in table.feature_names:
            columns.append(_pool(jts[name], weight, table.pooling, weighted))
    return torch.cat(columns, dim=1)


def _pool(jt: JaggedTensor, weight: Tensor, pooling: PoolingType, weighted: bool) -> Tensor:
    ids, offsets = jt.values().long(), jt.offsets().long()
    per_id = jt.weights().float() if weighted else None
    summed = F.embedding_bag(
        ids, weight, offsets, mode="sum", per_sample_weights=per_id, include_last_offset=True
    ).float()
    if pooling is PoolingType.MEAN:
        counts = offsets.diff().clamp(min=1).unsqueeze(1).to(summed.dtype)
        return summed / counts
    return summed


def sequence(
    tables: nn.ModuleDict,
    configs: Sequence[BaseEmbeddingConfig],
    embedding_names: Sequence[Sequence[str]],
    features: KeyedJaggedTensor,
    need_indices: bool,
) -> dict[str, JaggedTensor]:
    """``{embedding name: JaggedTensor of [ids, dim] rows}`` for each table's features, in table order."""
    jts = features.to_dict()
    out: dict[str, JaggedTensor] = {}
    for table, names in zip(configs, embedding_names):
        weight = tables[table.name].weight
        for feature, name in zip(table.feature_names, names):
            jt = jts[feature]
            ids = jt.values()
            out[name] = JaggedTensor(
                values=F.embedding(ids.long(), weight).float(),
                weights=ids if need_indices else None,
                lengths=jt.lengths(),
            )
    return out
