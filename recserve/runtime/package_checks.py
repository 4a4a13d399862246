"""Consistency of a package's manifest with its model config, before anything reaches FBGEMM.

The manifest carries no checksum of its own, so every size it states is checked against the model config
(and, in ``package.load_shards``, against the stored tensors): table rows and dims, the dtype's dim rule,
and a placement whose shards cover each table's rows exactly once. The kernels are sized from the
placement and the request checks from the config; if the two disagreed, checked ids could still fall
outside a kernel's rows. Errors are ``PackageError`` naming the manifest and the field.
"""

from __future__ import annotations

from recserve.errors import PackageError
from recserve.runtime.layout import dim_problem
from recserve.runtime.package import PackageManifest
from recserve.runtime.placement import ServingPlacement, TableShard
from rectrain.models.config import ModelConfig


def check_manifest(manifest: PackageManifest, cfg: ModelConfig, where: str) -> None:
    """PackageError unless ``manifest`` agrees with ``cfg`` and its placement covers every table once."""
    configs = {t.name: t for t in cfg.tables}
    seen: set[str] = set()
    for index, entry in enumerate(manifest.tables):
        field = f"{where}: tables[{index}] ({entry.name!r})"
        config = configs.get(entry.name)
        if config is None or entry.name in seen:
            problem = (
                "appears twice" if config is not None else f"is not a table of model_config {list(configs)}"
            )
            raise PackageError(f"{field}: {problem}")
        seen.add(entry.name)
        stated = (entry.num_embeddings, entry.embedding_dim)
        if stated != (config.num_embeddings, config.embedding_dim):
            raise PackageError(
                f"{field}: num_embeddings, embedding_dim = {stated}, but model_config says "
                f"{(config.num_embeddings, config.embedding_dim)}"
            )
        problem = dim_problem(entry.embedding_dim, entry.dtype)
        if problem:
            raise PackageError(f"{field}: {problem}")
    missing = [name for name in configs if name not in seen]
    if missing:
        raise PackageError(f"{where}: tables: model_config's tables {missing} are missing")
    if manifest.dense_in_features != cfg.dense_in_features:
        raise PackageError(
            f"{where}: dense_in_features {manifest.dense_in_features}, but model_config says "
            f"{cfg.dense_in_features}"
        )
    features = list(dict.fromkeys(f for t in cfg.tables for f in t.feature_names))
    if list(manifest.feature_names) != features:
        raise PackageError(
            f"{where}: feature_names {manifest.feature_names}, but model_config reads {features}"
        )
    check_placement(manifest.placement, {name: t.num_embeddings for name, t in configs.items()}, where)


def check_placement(placement: ServingPlacement, rows: dict[str, int], where: str) -> None:
    """PackageError unless every shard is on a listed device and each table's shards tile ``[0, rows)``."""
    if not placement.devices or len(set(placement.devices)) != len(placement.devices):
        raise PackageError(f"{where}: placement.devices {placement.devices} must be non-empty and distinct")
    by_table: dict[str, list[tuple[int, TableShard]]] = {}
    for index, shard in enumerate(placement.shards):
        field = f"{where}: placement.shards[{index}] ({shard.label} on {shard.device})"
        if shard.device not in placement.devices:
            raise PackageError(f"{field}: device is not one of placement.devices {placement.devices}")
        if shard.table not in rows:
            raise PackageError(f"{field}: table is not in model_config")
        if not 0 <= shard.row_start < shard.row_end <= rows[shard.table]:
            raise PackageError(
                f"{field}: rows must satisfy 0 <= row_start < row_end <= {rows[shard.table]} "
                f"(the table's num_embeddings)"
            )
        by_table.setdefault(shard.table, []).append((index, shard))
    for table, count in rows.items():
        covered = 0
        for index, shard in sorted(by_table.get(table, []), key=lambda item: item[1].row_start):
            if shard.row_start != covered:
                what = (
                    "overlaps the shard before it" if shard.row_start < covered else "leaves a gap before it"
                )
                raise PackageError(
                    f"{where}: placement.shards[{index}] ({shard.label}): {what}; the shards of table "
                    f"{table!r} must cover rows [0, {count}) exactly once"
                )
            covered = shard.row_end
        if covered != count:
            raise PackageError(
                f"{where}: placement: the shards of table {table!r} cover rows [0, {covered}) of [0, {count})"
            )
