"""Re-shard a checkpoint offline for another world size: plan for N ranks, rewrite the rank files.

No process group is needed: the tables are rebuilt from the manifest, the planner plans them for N ranks, and
each new rank file is assembled from slices of the old ones (one rank's tensors in memory at a time). Dense
state is copied as is; RNG states are dropped (they belong to the old ranks).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from rectrain.checkpoint.files import check_file, publish_dir, write_safetensors
from rectrain.checkpoint.manifest import (
    DENSE_FILE,
    LATEST,
    MANIFEST,
    ROW_COUNTS,
    Manifest,
    ShardEntry,
    StateEntry,
    TableEntry,
    rank_file,
    read_manifest,
    resolve_step_dir,
    step_dir_name,
)
from rectrain.checkpoint.reader import CheckpointReader
from rectrain.checkpoint.save import TMP_PREFIX
from rectrain.distributed.sharded.table import shard_tables_of
from rectrain.durable import fsync_path, write_text_atomic
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.planner import EmbeddingShardingPlanner, ShardingPlan, Topology
from rectrain.planner.types import ShardingType

logger = logging.getLogger(__name__)


def table_configs(manifest: Manifest) -> dict[str, list]:
    """``{collection path: [table config]}`` rebuilt from the manifest's collection summary."""
    configs: dict[str, list] = {}
    for path, collection in manifest.collections.items():
        cls = EmbeddingBagConfig if collection.get("kind") == "EmbeddingBagCollection" else EmbeddingConfig
        configs[path] = [cls(**table) for table in collection["tables"]]
    return configs


def plan_for_world(manifest: Manifest, world_size: int) -> ShardingPlan:
    """The planner's plan for the checkpoint's tables on ``world_size`` cpu ranks."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive int, got {world_size!r}")
    optimizers = [c.get("fused_optimizer", {}).get("optimizer") for c in manifest.collections.values()]
    fused = FusedOptimizerConfig(optimizers[0]) if optimizers and optimizers[0] else None
    planner = EmbeddingShardingPlanner(
        Topology(world_size=world_size, compute_device="cpu"), fused_optimizer=fused
    )
    return planner.plan(table_configs(manifest))


def _rank_tables(
    reader: CheckpointReader, plan: ShardingPlan, configs: dict[str, list], rank: int
) -> tuple[dict[str, Any], dict[str, list[tuple[str, str, ShardEntry]]]]:
    """This new rank's tensors, and per table key its ``(state name, kind, shard entry)`` list."""
    tensors, entries = {}, {}
    by_name = {(path, c.name): c for path, tables in configs.items() for c in tables}
    for key, table in reader.manifest.tables.items():
        config = by_name[(table.collection, table.name)]
        sharding = plan.plan[table.collection][table.name]
        if sharding.sharding_type is ShardingType.DATA_PARALLEL and rank != 0:
            continue  # replicas are stored once
        for _, shard in shard_tables_of(config, sharding, rank):
            base = f"{key}/{shard.row_offset}_{shard.col_offset}"
            for name, state in table.stored_states():
                value = reader.read(state, shard, f"{key} {name}").contiguous()
                tensors[f"{base}/{name}"] = value
                entry = ShardEntry(
                    rank_file(rank), f"{base}/{name}", shard.row_offset, shard.num_rows,
                    shard.col_offset, shard.num_cols, tuple(value.shape), rank,
                )  # fmt: skip
                entries.setdefault(key, []).append((name, state.kind, entry))
    return tensors, entries


def _new_tables(manifest: Manifest, plan: ShardingPlan, entries: dict[str, list]) -> dict[str, TableEntry]:
    tables = {}
    for key, old in manifest.tables.items():
        states = {name: StateEntry(s.kind, s.dtype, []) for name, s in old.stored_states()}
        for name, _, entry in entries.get(key, []):
            states[name].shards.append(entry)
        kind = plan.plan[old.collection][old.name].sharding_type.value
        tables[key] = dataclasses.replace(
            old,
            sharding_type=kind,
            weight=states.pop("weight"),
            row_counts=states.pop(ROW_COUNTS, None),
            optimizer_state=states,
        )
    return tables


def reshard_checkpoint(
    src: str | Path,
    *,
    world_size: int,
    out: str | Path,
    step: int | None = None,
    plan: ShardingPlan | None = None,
    verify_checksums: bool = True,
) -> Path:
    """Write the checkpoint at ``src`` re-sharded for ``world_size`` ranks (by ``plan``, or the planner's) as
    ``<out>/step_<N>`` and point ``<out>/latest`` at it. Returns the new step directory."""
    step_dir = resolve_step_dir(src, step)
    manifest = read_manifest(step_dir)
    plan = plan or plan_for_world(manifest, world_size)
    if plan.world_size != world_size:
        raise ConfigError(f"plan is for world_size {plan.world_size}, asked for {world_size}")
    root = Path(out)
    tmp = root / f"{TMP_PREFIX}{step_dir_name(manifest.step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    files, entries = {}, {}
    configs = table_configs(manifest)
    with CheckpointReader(step_dir, manifest, verify_checksums) as reader:
        for rank in range(world_size):
            tensors, rank_entries = _rank_tables(reader, plan, configs, rank)
            files[rank_file(rank)] = write_safetensors(tmp / rank_file(rank), tensors)
            for key, items in rank_entries.items():
                entries.setdefault(key, []).extend(items)
        if DENSE_FILE in manifest.files:
            check_file(step_dir / DENSE_FILE, manifest.files[DENSE_FILE], verify_checksums)
            shutil.copyfile(step_dir / DENSE_FILE, tmp / DENSE_FILE)
            fsync_path(tmp / DENSE_FILE)
            files[DENSE_FILE] = manifest.files[DENSE_FILE]
    new = dataclasses.replace(
        manifest,
        world_size=world_size,
        plan=plan.to_dict(),
        tables=_new_tables(manifest, plan, entries),
        files=files,
        rng={},
        created_unix=time.time(),
    )
    write_text_atomic(tmp / MANIFEST, new.to_json())
    final = root / step_dir_name(manifest.step)
    publish_dir(tmp, final)
    write_text_atomic(root / LATEST, final.name + "\n")
    logger.info("re-sharded %s for %d ranks into %s", step_dir, world_size, final)
    return final
