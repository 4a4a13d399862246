"""Load a checkpoint into a model of any sharding, and assemble full tensors for export.

``load_checkpoint`` copies into the model's own storage: each rank reads, for every table, only the rows and
columns of its own shards (``CheckpointReader``), so a checkpoint saved with one world size and plan loads
into another (or into a plain, unsharded module). Dense state, dense optimizer state and, with the same world
size, each rank's RNG state are restored too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rectrain.checkpoint import model_state
from rectrain.checkpoint.errors import CheckpointError, CheckpointMismatchError
from rectrain.checkpoint.manifest import Manifest, TableEntry, read_manifest, resolve_step_dir
from rectrain.checkpoint.optimizer_state import check_state_shapes, dense_optimizers, unflatten
from rectrain.checkpoint.reader import CheckpointReader
from rectrain.checkpoint.sync import resolve_env
from rectrain.distributed.comm.env import ShardingEnv
from rectrain.planner.types import Shard

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointInfo:
    """What was loaded: the step, the saved ``extra`` (e.g. data-loader position) and where from."""

    step: int
    extra: dict[str, Any]
    path: Path
    saved_world_size: int
    resharded: bool
    manifest: Manifest
    files_read: tuple[str, ...] = ()


def _table_entry(manifest: Manifest, key: str, table: model_state.LocalTable) -> TableEntry:
    entry = manifest.tables.get(key)
    if entry is None:
        raise CheckpointMismatchError(
            f"the checkpoint has no table {key!r} (model table {table.name!r}); "
            f"it has {sorted(manifest.tables)}"
        )
    if tuple(entry.global_shape) != tuple(table.global_shape):
        raise CheckpointMismatchError(
            f"table {table.name!r} ({key}): the checkpoint has shape {list(entry.global_shape)}, "
            f"the model {list(table.global_shape)}"
        )
    return entry


def _read_into(reader: CheckpointReader, entry: Any, shard: Shard, target: Tensor, what: str) -> None:
    """The saved slice of ``entry`` covering ``shard``, streamed into ``target`` (its shape checked)."""
    try:
        reader.read_into(entry, shard, target, what)
    except RuntimeError as error:  # copy_ of a per-row or scalar state into a target of another shape
        raise CheckpointMismatchError(f"{what}: {error}") from None


def _copy_into(target: Tensor, value: Tensor, what: str) -> None:
    if value.shape != target.shape:
        raise CheckpointMismatchError(
            f"{what}: checkpoint shape {list(value.shape)}, model {list(target.shape)}"
        )
    target.copy_(value)


@torch.no_grad()
def _load_tables(reader: CheckpointReader, model: nn.Module, with_optimizer: bool) -> None:
    manifest = reader.manifest
    for key, table in model_state.local_tables(model).items():
        entry = _table_entry(manifest, key, table)
        for piece in table.pieces:
            where = f"table {table.name!r} rows {piece.shard.row_offset}+{piece.shard.num_rows}"
            _read_into(reader, entry.weight, piece.shard, piece.weight, where)
            _load_counts(entry, reader, piece, where)
            if not with_optimizer:
                continue
            missing = sorted(set(piece.states) - set(entry.optimizer_state))
            if missing:
                saved = sorted(entry.optimizer_state)
                raise CheckpointMismatchError(
                    f"table {table.name!r}: the fused optimizer needs state {missing}, "
                    f"the checkpoint has {saved} "
                    "(was it saved with another embedding optimizer?)"
                )
            for name, state in piece.states.items():
                what = f"{where}, optimizer state {name!r}"
                _read_into(reader, entry.optimizer_state[name], piece.shard, state, what)


def _load_counts(
    entry: TableEntry, reader: CheckpointReader, piece: model_state.TablePiece, where: str
) -> None:
    """Restore a counted piece's row counts (zero when the checkpoint holds none: counting starts now)."""
    if piece.counts is None:
        return
    if entry.row_counts is None:
        logger.info("%s: the checkpoint holds no row counts; counting starts from zero", where)
        piece.counts.zero_()
        return
    _read_into(reader, entry.row_counts, piece.shard, piece.counts, f"{where}, row counts")


@torch.no_grad()
def _load_dense(reader: CheckpointReader, model: nn.Module) -> None:
    saved = reader.manifest.dense_params
    target = model_state.dense_state(model)
    missing = sorted(set(target) - set(saved))
    if missing:
        raise CheckpointMismatchError(f"the checkpoint has no dense state for {missing}")
    unexpected = sorted(set(saved) - set(target))
    if unexpected:
        logger.warning("checkpoint dense state not in the model (ignored): %s", unexpected)
    for name, tensor in target.items():
        _copy_into(tensor, reader.dense(saved[name].tensor), f"dense parameter {name!r}")


def _load_dense_optimizer(reader: CheckpointReader, optimizer: torch.optim.Optimizer) -> None:
    members = dense_optimizers(optimizer)
    saved = reader.manifest.dense_optimizer or {}
    if sorted(members) != sorted(saved):
        raise CheckpointMismatchError(
            f"dense optimizers: the checkpoint has {sorted(saved)}, the given optimizer {sorted(members)}"
        )
    for name, member in members.items():
        state = unflatten(saved[name], reader.dense)
        check_state_shapes(name, member, state)
        member.load_state_dict(state)


def _load_rng(reader: CheckpointReader, env: ShardingEnv) -> None:
    manifest = reader.manifest
    entry = manifest.rng.get(str(env.rank))
    if manifest.world_size != env.world_size or entry is None:
        logger.info(
            "world size changed (%d -> %d): RNG states not restored", manifest.world_size, env.world_size
        )
        return
    try:
        torch.set_rng_state(reader.tensor(entry["file"], entry["torch_cpu"]))
        if "torch_cuda" in entry and torch.cuda.is_available():
            torch.cuda.set_rng_state(reader.tensor(entry["file"], entry["torch_cuda"]))
    except (KeyError, TypeError, RuntimeError) as e:  # torch checks the state's size and dtype
        raise CheckpointError(f"{reader.step_dir}: RNG state of rank {env.rank} is unusable ({e})") from None


def load_checkpoint(
    dir: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int | None = None,
    env: ShardingEnv | None = None,
    verify_checksums: bool = True,
) -> CheckpointInfo:
    """Load the checkpoint at ``dir`` (``latest``, or ``step``) into ``model`` and ``optimizer``.

    ``model`` may be sharded differently from the saved model (another world size or plan) or be a plain
    module. With ``optimizer`` given, the fused embedding optimizers' state (re-sharded with the tables,
    see ``reader``), their learning rates and the dense optimizers' state are restored; without it only
    the model. RNG states are restored when the world size is unchanged. Each file this rank opens is
    checked against the manifest's sha256 unless ``verify_checksums`` is False (sizes are always checked).
    Not collective: each rank reads what it needs.
    """
    env = resolve_env(model, env)
    step_dir = resolve_step_dir(dir, step)
    manifest = read_manifest(step_dir)
    with CheckpointReader(step_dir, manifest, verify_checksums) as reader:
        _load_tables(reader, model, with_optimizer=optimizer is not None)
        _load_dense(reader, model)
        if optimizer is not None:
            model_state.set_fused_learning_rates(model, manifest.collections)
            _load_dense_optimizer(reader, optimizer)
        _load_rng(reader, env)
        files_read = tuple(reader.files_opened)
    plan = getattr(model, "plan", None)
    same_plan = plan is not None and manifest.plan == plan.to_dict()
    resharded = manifest.world_size != env.world_size or not same_plan
    logger.info(
        "loaded checkpoint %s (step %d)%s", step_dir, manifest.step, " re-sharded" if resharded else ""
    )
    return CheckpointInfo(
        manifest.step, dict(manifest.extra), step_dir, manifest.world_size, resharded, manifest, files_read
    )


def full_table(reader: CheckpointReader, key: str, entry: TableEntry) -> Tensor:
    """A whole table's weight assembled from its shards."""
    rows, cols = entry.global_shape
    return reader.read(entry.weight, Shard(0, rows, 0, cols, 0), f"{key} weight")


def load_full_state(
    dir: str | Path, step: int | None = None, verify_checksums: bool = True
) -> tuple[Manifest, dict[str, Tensor]]:
    """Every table and dense parameter as a full tensor, named as in the prediction module's state dict.

    For export, in one process: the training wrapper's prefix (``manifest.prediction_prefix``, e.g.
    ``"model."``) is removed, and dense entries outside the prediction module are left out.
    """
    step_dir = resolve_step_dir(dir, step)
    manifest = read_manifest(step_dir)
    prefix = manifest.prediction_prefix
    state: dict[str, Tensor] = {}
    with CheckpointReader(step_dir, manifest, verify_checksums) as reader:
        for key, entry in manifest.tables.items():
            if not key.startswith(prefix):
                raise CheckpointError(
                    f"{step_dir}: table {key!r} lies outside the prediction module {prefix!r}"
                )
            state[key[len(prefix) :]] = full_table(reader, key, entry)
        for name, entry in manifest.dense_params.items():
            if name.startswith(prefix):
                state[name[len(prefix) :]] = reader.dense(entry.tensor)
    return manifest, state
