"""How a collection's tables map onto output keys and onto FBGEMM kernels.

Pure functions over configs: naming follows TorchRec so that output keys match, and grouping decides which
tables can share one FBGEMM table-batched embedding (TBE) module.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.errors import ConfigError

ConfigT = TypeVar("ConfigT", bound=BaseEmbeddingConfig)


def check_table_names(tables: Sequence[BaseEmbeddingConfig]) -> None:
    """Raise ConfigError unless every table has a non-empty name that no other table uses."""
    if not tables:
        raise ConfigError("tables is empty: a collection needs at least one table")
    seen: set[str] = set()
    for position, table in enumerate(tables):
        if not table.name:
            raise ConfigError(f"tables[{position}] has no name; every table needs a unique name")
        if table.name in seen:
            raise ConfigError(f"duplicate table name {table.name!r} (tables[{position}])")
        seen.add(table.name)


def get_embedding_names_by_table(tables: Sequence[BaseEmbeddingConfig]) -> list[list[str]]:
    """Output key of each (table, feature) pair, as TorchRec names them.

    A feature read by one table keeps its name; a feature read by several tables becomes
    ``"<feature>@<table>"`` in each of them so that the keys stay unique.
    """
    readers: dict[str, int] = {}
    for table in tables:
        for feature in table.feature_names:
            readers[feature] = readers.get(feature, 0) + 1
    return [
        [f"{feature}@{table.name}" if readers[feature] > 1 else feature for feature in table.feature_names]
        for table in tables
    ]


def group_tables(tables: Sequence[ConfigT], key: Callable[[ConfigT], Hashable]) -> list[list[int]]:
    """Indices of ``tables`` grouped by ``key``, groups in order of first appearance, table order kept.

    One FBGEMM TBE has a single pooling mode (and, for sequence lookups, a single dim) and a single weight
    precision, so tables that differ in those must go to different TBEs.
    """
    groups: dict[Hashable, list[int]] = {}
    for index, table in enumerate(tables):
        groups.setdefault(key(table), []).append(index)
    return list(groups.values())
