"""Collect the embedding tables to plan, per module path, from a dict or by scanning a module."""

from __future__ import annotations

from typing import Any

from torch import nn

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.errors import ConfigError

# Methods through which TorchRec's EmbeddingBagCollection / EmbeddingCollection expose their tables.
_CONFIG_METHODS = ("embedding_bag_configs", "embedding_configs")


def collect_tables(
    module_or_tables: nn.Module | dict[str, list[BaseEmbeddingConfig]],
) -> dict[str, list[BaseEmbeddingConfig]]:
    """``{module_path: [table configs]}``, checked: configs are table configs with unique, non-empty names.

    A module is scanned for submodules with an ``embedding_bag_configs()`` or ``embedding_configs()`` method
    (the collections' TorchRec API); their paths in ``named_modules()`` become the module paths.
    """
    if isinstance(module_or_tables, nn.Module):
        tables = _scan(module_or_tables)
    elif isinstance(module_or_tables, dict):
        tables = {path: list(configs) for path, configs in module_or_tables.items()}
    else:
        raise ConfigError(
            "plan() takes a dict {module_path: [EmbeddingBagConfig | EmbeddingConfig]} or an nn.Module, "
            f"got {type(module_or_tables).__name__}"
        )
    if not any(tables.values()):
        raise ConfigError("there are no embedding tables to plan")
    for path, configs in tables.items():
        if not isinstance(path, str):
            raise ConfigError(f"module paths must be str, got {path!r}")
        for config in configs:
            if not isinstance(config, BaseEmbeddingConfig):
                raise ConfigError(f"module {path!r}: expected table configs, got {type(config).__name__}")
            if not config.name:
                raise ConfigError(
                    f"module {path!r}: every table needs a name (one has num_embeddings "
                    f"{config.num_embeddings}, embedding_dim {config.embedding_dim})"
                )
            if config.use_virtual_table:
                raise ConfigError(
                    f"module {path!r}, table {config.name!r}: use_virtual_table=True is a key-value "
                    "virtual table, which rectrain does not run (use_virtual_table=False: a plain table)"
                )
        names = [c.name for c in configs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"module {path!r}: table names must be unique; repeated: {duplicates}")
    return tables


def _scan(module: nn.Module) -> dict[str, list[BaseEmbeddingConfig]]:
    found = {}
    for path, sub in module.named_modules():
        for method in _CONFIG_METHODS:
            if callable(getattr(sub, method, None)):
                found[path] = list(getattr(sub, method)())
                break
    return found


def sharded_tables(module: nn.Module, sharders: list[Any]) -> dict[str, list[BaseEmbeddingConfig]]:
    """``{module_path: [table configs]}`` of what ``sharders`` shard in ``module`` (TorchRec's rule): modules
    whose type a sharder takes (their children are not visited), and of those only the tables in the
    sharder's ``shardable_parameters``."""
    by_type = {s.module_type: s for s in sharders}
    found, queue = {}, [("", module)]
    while queue:
        path, child = queue.pop(0)
        sharder = by_type.get(type(child))
        if sharder is None:
            queue += [(f"{path}.{name}" if path else name, sub) for name, sub in child.named_children()]
            continue
        names = set(sharder.shardable_parameters(child))
        configs = [c for c in _scan(child).get("", []) if c.name in names]
        if configs:
            found[path] = configs
    return found
