"""What a checkpoint reads from and writes into a model: its tables (as shards with fused optimizer state),
its dense state and its collections, for a ``DistributedModelParallel`` and a plain module alike.

A plain module's table is one shard covering the whole table; a sharded table is this rank's shards as
``DistributedModelParallel`` holds them. Every tensor handed out is a view of the model's own storage, so a
loader restores state by copying into it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from rectrain.checkpoint.errors import CheckpointError
from rectrain.checkpoint.manifest import PER_ELEMENT, PER_ROW, SCALAR
from rectrain.distributed.parallel.model_parallel import DistributedModelParallel, find_collections
from rectrain.optim import CombinedOptimizer, FusedEmbeddingOptimizer
from rectrain.planner.types import Shard, ShardingType

UNSHARDED = "unsharded"


@dataclass
class TablePiece:
    """One rectangle of a table held by this rank: its weight and fused optimizer state (views)."""

    shard: Shard
    weight: Tensor
    states: dict[str, Tensor] = field(default_factory=dict)
    counts: Tensor | None = None  # int32 lookups per row, where training counts them (``row_counts``)


@dataclass
class LocalTable:
    """One table as this rank sees it. ``replicated``: every rank holds the same copy (saved by rank 0)."""

    collection: str
    name: str
    global_shape: tuple[int, int]
    sharding_type: str
    replicated: bool
    pieces: list[TablePiece]


def unwrap(model: nn.Module) -> nn.Module:
    """The model without the DMP/DDP wrappers (its state-dict names are the model's own)."""
    return model.module if isinstance(model, DistributedModelParallel) else model


def _key(path: str, attribute: str, table: str) -> str:
    return f"{path}.{attribute}.{table}.weight" if path else f"{attribute}.{table}.weight"


def _attribute(collection: nn.Module) -> str:
    return "embedding_bags" if hasattr(collection, "embedding_bag_configs") else "embeddings"


def _configs(collection: nn.Module) -> list:
    if hasattr(collection, "embedding_bag_configs"):
        return list(collection.embedding_bag_configs())
    return list(collection.embedding_configs())


def collections_of(model: nn.Module) -> dict[str, nn.Module]:
    """``{path: collection}``: the sharded collections of a DMP, the plain ones of any other module."""
    if isinstance(model, DistributedModelParallel):
        return model.sharded_modules()
    found = find_collections(model)
    for path, collection in found.items():
        if collection.fused_optimizer_config is None:
            raise CheckpointError(
                f"the embedding collection at {path!r} was built without fused_optimizer= (TorchRec's way: "
                "its tables are parameters of the model's optimizer); save it with state_dict() or "
                "torch.distributed.checkpoint, or build it with fused_optimizer= to use save_checkpoint"
            )
    return found


def local_tables(model: nn.Module) -> dict[str, LocalTable]:
    """Every table of ``model`` keyed by its weight's state-dict name, with this rank's pieces of it."""
    if isinstance(model, DistributedModelParallel):
        return _sharded_tables(model)
    tables = {}
    for path, collection in collections_of(model).items():
        attribute = _attribute(collection)
        kernels = getattr(collection, attribute)
        states = kernels.table_optimizer_states()
        for config in _configs(collection):
            shape = (config.num_embeddings, config.embedding_dim)
            piece = TablePiece(
                Shard(0, shape[0], 0, shape[1], 0), kernels[config.name].weight, states[config.name]
            )
            tables[_key(path, attribute, config.name)] = LocalTable(
                path, config.name, shape, UNSHARDED, replicated=True, pieces=[piece]
            )
    return tables


def _sharded_tables(model: DistributedModelParallel) -> dict[str, LocalTable]:
    tables = {}
    for path, module in model.sharded_modules().items():
        inner = f"{path}." if path else ""
        weights, states = module.sharded_state(), module.sharded_optimizer_state()
        counted = module.sharded_row_counts() if hasattr(module, "sharded_row_counts") else {}
        for config in _configs(module):
            key = f"{_attribute(module)}.{config.name}.weight"
            sharded = weights[key]
            counts = [c for _, c in counted.get(key, [])] or [None] * len(sharded.local_shards)
            pieces = [
                TablePiece(shard, weight, state, count)
                for (shard, weight), (_, state), count in zip(sharded.local_shards, states[key], counts)
            ]
            kind = sharded.sharding.sharding_type
            tables[inner + key] = LocalTable(
                path,
                config.name,
                sharded.global_shape,
                kind.value,
                replicated=kind is ShardingType.DATA_PARALLEL,
                pieces=pieces,
            )
    return tables


def state_kind(name: str, tensor: Tensor, shard: Shard) -> str:
    """How an optimizer state relates to its shard (see ``manifest.STATE_KINDS``)."""
    if name == "step" or name.endswith(".step"):
        return SCALAR
    if tuple(tensor.shape) == (shard.num_rows, shard.num_cols):
        return PER_ELEMENT
    if tuple(tensor.shape) == (shard.num_rows,):
        return PER_ROW
    raise AssertionError(f"optimizer state {name!r} has shape {list(tensor.shape)} for shard {shard}")


def dense_state(model: nn.Module) -> dict[str, Tensor]:
    """The model's state-dict entries outside its embedding collections (dense parameters and buffers)."""
    root = unwrap(model)
    paths = list(collections_of(model))
    if "" in paths:
        return {}
    inner = tuple(f"{p}." for p in paths)
    return {k: v for k, v in root.state_dict().items() if not k.startswith(inner)}


def prediction_prefix(model: nn.Module) -> str:
    """The state-dict prefix of the prediction module inside a training wrapper (``"model."`` for
    ``DLRMTrain``; ``"prediction_model."`` where a wrapper exposes one), or ``""``.

    The wrapped module is taken when it holds every embedding collection of the model.
    """
    root = unwrap(model)
    paths = list(collections_of(model))
    for attribute in ("prediction_model", "model"):
        child = getattr(root, attribute, None)
        if isinstance(child, nn.Module) and child is not root:
            name = next((n for n, m in root.named_children() if m is child), None)
            if name is not None and all(p.startswith(f"{name}.") for p in paths):
                return f"{name}."
    return ""


def _table_dict(config: Any) -> dict[str, Any]:
    entry = {
        "name": config.name,
        "num_embeddings": config.num_embeddings,
        "embedding_dim": config.embedding_dim,
        "feature_names": list(config.feature_names),
        "data_type": config.data_type.value,
    }
    if hasattr(config, "pooling"):
        entry["pooling"] = config.pooling.value
    return entry


def fused_optimizers(optimizer: torch.optim.Optimizer) -> list[FusedEmbeddingOptimizer]:
    """Every fused embedding optimizer inside ``optimizer`` (nested combined optimizers included)."""
    if isinstance(optimizer, FusedEmbeddingOptimizer):
        return [optimizer]
    if isinstance(optimizer, CombinedOptimizer):
        return [f for _, member in optimizer.optimizers for f in fused_optimizers(member)]
    return []


def collection_summary(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{path: {kind, tables, fused_optimizer}}`` for the manifest: enough to rebuild the tables offline."""
    summary = {}
    for path, collection in collections_of(model).items():
        pooled = hasattr(collection, "embedding_bag_configs")
        fused = fused_optimizers(collection.fused_optimizer)
        group = collection.fused_optimizer.param_groups[0]
        summary[path] = {
            "kind": "EmbeddingBagCollection" if pooled else "EmbeddingCollection",
            "sharded": hasattr(collection, "env"),
            "tables": [_table_dict(c) for c in _configs(collection)],
            "fused_optimizer": {
                "optimizer": fused[0].optimizer_type.value if fused else None,
                **{k: v for k, v in group.items() if k != "params" and isinstance(v, (int, float))},
            },
        }
    return summary


def set_fused_learning_rates(model: nn.Module, summary: dict[str, dict[str, Any]]) -> None:
    """Give each collection's fused optimizer the learning rate it had when the checkpoint was saved."""
    for path, collection in collections_of(model).items():
        entry = summary.get(path, {})
        fused = entry.get("fused_optimizer", {}) if isinstance(entry, dict) else None
        lr = fused.get("lr") if isinstance(fused, dict) else None
        if lr is not None:
            # The kernels read the rate as a float: refuse anything else (a bool, a string, NaN) by name.
            if isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or lr < 0:
                raise CheckpointError(
                    f"manifest collections[{path!r}].fused_optimizer.lr must be a finite number >= 0, "
                    f"got {lr!r:.40}"
                )
            for group in collection.fused_optimizer.param_groups:
                group["lr"] = lr
