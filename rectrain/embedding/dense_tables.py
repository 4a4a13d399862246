"""Tables as plain parameters with gradients: the collections built without ``fused_optimizer=``.

TorchRec's unsharded ``EmbeddingBagCollection`` / ``EmbeddingCollection`` hold each table in an
``nn.EmbeddingBag`` / ``nn.Embedding``: backward writes a dense ``.grad`` into the table and the user's
optimizer updates it (Adam, weight decay, LR schedulers, gradient clipping, ``apply_optimizer_in_backward``).
A collection built without ``fused_optimizer=`` does exactly that, with the same torch ops, so TorchRec code
trains the same model. The fused FBGEMM path (``fused_tables``) is the explicit choice for speed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rectrain.embedding import init
from rectrain.embedding.config import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, PoolingType
from rectrain.embedding.feature_routing import KJTLike
from rectrain.errors import ConfigError
from rectrain.sparse import JaggedTensor

logger = logging.getLogger(__name__)

_DTYPES = {DataType.FP32: torch.float32, DataType.FP16: torch.float16, DataType.BF16: torch.bfloat16}


def _dtype(table: BaseEmbeddingConfig) -> torch.dtype:
    if table.data_type not in _DTYPES:
        names = ", ".join(d.value for d in _DTYPES)
        raise ConfigError(
            f"table {table.name!r}: data_type {table.data_type.value} cannot be trained; use one of {names} "
            "(quantized types are for serving)"
        )
    return _DTYPES[table.data_type]


def _empty(table: BaseEmbeddingConfig, device: torch.device) -> Tensor:
    # Passing the storage skips nn.Embedding's own normal_() draw: reset_dense() gives every table its values.
    return torch.empty(table.num_embeddings, table.embedding_dim, dtype=_dtype(table), device=device)


def _bag_mode(table: EmbeddingBagConfig, is_weighted: bool) -> str:
    # torch pools per-sample weights only with "sum"; weighted MEAN is SUM divided by the bag length.
    if table.pooling is PoolingType.MEAN and not is_weighted:
        return "mean"
    return "sum"


def _say_disk_tables_stay_in_ram(tables: Sequence[BaseEmbeddingConfig]) -> None:
    """Disk storage lives in the fused kernels (``disk_tables``): say so rather than drop the choice."""
    disk = [t.name for t in tables if t.storage == "disk"]
    if disk:
        logger.warning(
            "tables %s ask for storage 'disk', but a collection without fused_optimizer= holds its tables as "
            "plain parameters in RAM; build it with fused_optimizer= to keep them on disk",
            disk,
        )


def dense_bags(
    tables: Sequence[EmbeddingBagConfig], is_weighted: bool, device: torch.device
) -> nn.ModuleDict:
    """``{table name: nn.EmbeddingBag}``; state-dict keys ``<table>.weight`` as TorchRec's."""
    _say_disk_tables_stay_in_ram(tables)
    return nn.ModuleDict(
        {
            t.name: nn.EmbeddingBag(
                t.num_embeddings,
                t.embedding_dim,
                mode=_bag_mode(t, is_weighted),
                include_last_offset=True,
                _weight=_empty(t, device),
            )
            for t in tables
        }
    )


def dense_embeddings(tables: Sequence[BaseEmbeddingConfig], device: torch.device) -> nn.ModuleDict:
    """``{table name: nn.Embedding}``; state-dict keys ``<table>.weight`` as TorchRec's."""
    _say_disk_tables_stay_in_ram(tables)
    return nn.ModuleDict(
        {t.name: nn.Embedding(t.num_embeddings, t.embedding_dim, _weight=_empty(t, device)) for t in tables}
    )


@torch.no_grad()
def reset_dense(tables: Sequence[BaseEmbeddingConfig], modules: nn.ModuleDict, seed: int) -> None:
    """Give every table its initial values from ``seed`` (``rectrain.embedding.init``: a function of the seed,
    the table and the global row; each table's ``init_fn``, else uniform in [weight_init_min,
    weight_init_max]).

    The fused tables draw theirs the same way, so one seed gives the same weights whether a collection is
    fused or not, sharded or not. Tables on the meta device are left as they are (nothing allocated).
    """
    for table in tables:
        weight = modules[table.name].weight
        if not weight.is_meta:
            init.fill_rows(weight, table, seed)


def is_meta(modules: nn.ModuleDict) -> bool:
    """Whether the tables are only described (meta device)."""
    return any(p.is_meta for p in modules.parameters())


def device_of(modules: nn.ModuleDict, default: torch.device) -> torch.device:
    """Where the tables live (``default`` for a collection without tables)."""
    return next((p.device for p in modules.parameters()), default)


def _feature(
    by_key: dict[str, JaggedTensor], name: str, tables: Sequence[BaseEmbeddingConfig]
) -> JaggedTensor:
    if name not in by_key:
        wanted = sorted({f for t in tables for f in t.feature_names})
        raise ValueError(
            f"KeyedJaggedTensor has no feature {name!r}; the collection reads {wanted} and the input has "
            f"keys {list(by_key)}"
        )
    return by_key[name]


def _lookup(
    module: nn.Module, table: BaseEmbeddingConfig, feature: str, ids: Tensor, *args, **kwargs
) -> Tensor:
    """``module(ids, ...)``; an id outside the table is named (only checked after torch refused it)."""
    try:
        return module(ids, *args, **kwargs)
    except (IndexError, RuntimeError) as error:
        bad = ids[(ids < 0) | (ids >= table.num_embeddings)]
        if bad.numel():
            raise ValueError(
                f"feature {feature!r}: id {int(bad[0])} is out of range for its table "
                f"(num_embeddings={table.num_embeddings}); ids must lie in [0, {table.num_embeddings})"
            ) from error
        raise


def _offsets(jt: JaggedTensor, values: Tensor) -> Tensor:
    # torch's embedding_bag wants ids and offsets of one integer type.
    offsets = jt.offsets()
    return offsets if offsets.dtype == values.dtype else offsets.to(values.dtype)


@torch.fx.wrap
def dense_pooled(
    bags: nn.ModuleDict,
    tables: Sequence[EmbeddingBagConfig],
    features: KJTLike,
    is_weighted: bool,
) -> Tensor:
    """``[batch, sum of dims]`` float32: each table's features pooled in table order (TorchRec's forward)."""
    if is_weighted and features.weights_or_none() is None:
        raise ValueError(
            "this collection is weighted (is_weighted=True) but the KeyedJaggedTensor has no weights"
        )
    by_key = features.to_dict()
    pooled = []
    for table in tables:
        bag = bags[table.name]
        for name in table.feature_names:
            jt = _feature(by_key, name, tables)
            values = jt.values()
            weights = jt.weights_or_none() if is_weighted else None
            offsets = _offsets(jt, values)
            out = _lookup(bag, table, name, values, offsets, per_sample_weights=weights).float()
            if is_weighted and table.pooling is PoolingType.MEAN:
                out = out / jt.lengths().clamp(min=1).to(out.dtype).unsqueeze(1)
            pooled.append(out)
    return torch.cat(pooled, dim=1)


@torch.fx.wrap
def dense_sequence(
    embeddings: nn.ModuleDict,
    tables: Sequence[BaseEmbeddingConfig],
    names_by_table: Sequence[Sequence[str]],
    features: KJTLike,
    need_indices: bool,
) -> dict[str, JaggedTensor]:
    """``{embedding name: JaggedTensor}`` with float32 ``[num ids, dim]`` values (TorchRec's forward)."""
    by_key = features.to_dict()
    out: dict[str, JaggedTensor] = {}
    for table, names in zip(tables, names_by_table):
        for feature, name in zip(table.feature_names, names):
            jt = _feature(by_key, feature, tables)
            values = _lookup(embeddings[table.name], table, feature, jt.values()).float()
            out[name] = JaggedTensor(
                values=values, lengths=jt.lengths(), weights=jt.values() if need_indices else None
            )
    return out
