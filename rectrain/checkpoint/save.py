"""Save a checkpoint: every rank writes its shards in parallel, rank 0 the dense state and the manifest.

The order of work (``save_checkpoint``; the asynchronous form runs step 3 in a background thread):
1. snapshot: this rank's table shards with their fused optimizer state, its RNG state, and on rank 0 the
   dense parameters and dense optimizer state (views; copies to host memory when saving asynchronously);
2. rank 0 creates ``<root>/.tmp_step_<N>``; barrier;
3. each rank writes ``rank_<r>.safetensors`` (rank 0 also ``dense.safetensors``), fsyncs and hashes it;
4. all ranks gather their shard lists and checksums (any rank's write error is raised on every rank);
5. rank 0 writes ``manifest.json``, renames the directory to ``step_<N>``, then points ``latest`` at it
   (temp file + rename) and deletes all but the ``keep_last`` most recently saved; the others wait for it.
A process killed before step 5 finishes leaves only a ``.tmp_step_*`` directory, which the next save removes;
``latest`` and the checkpoints it points at are never touched before the new one is complete. Old
checkpoints are renamed to a ``.tmp_`` name before they are deleted, so a kill during the clean-up leaves
nothing that looks like a checkpoint (see ``retention``).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rectrain.checkpoint import model_state
from rectrain.checkpoint.errors import CheckpointError
from rectrain.checkpoint.files import publish_dir, write_safetensors
from rectrain.checkpoint.manifest import (
    DENSE_FILE,
    LATEST,
    MANIFEST,
    PER_ELEMENT,
    PER_ROW,
    ROW_COUNTS,
    Manifest,
    dtype_name,
    rank_file,
    step_dir_name,
)
from rectrain.checkpoint.optimizer_state import dense_optimizers, flatten
from rectrain.checkpoint.retention import TMP_PREFIX, prune
from rectrain.checkpoint.sync import all_gather_object, barrier, broadcast_object, resolve_env
from rectrain.distributed.comm.env import ShardingEnv
from rectrain.durable import write_text_atomic
from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class _Snapshot:
    """What one rank writes, and on rank 0 what goes into the manifest besides the gathered shard lists."""

    rank: int
    tmp_dir: Path
    tensors: dict[str, Tensor]
    tables: dict[str, dict[str, Any]]
    rng: dict[str, str]
    dense_tensors: dict[str, Tensor] | None = None
    manifest_fields: dict[str, Any] = field(default_factory=dict)


def _copy(tensor: Tensor, copy: bool) -> Tensor:
    """A host copy for an asynchronous save; else the tensor itself (the writer streams it from its own
    memory, staging a bounded chunk when it is not contiguous on the CPU: no second copy of a shard)."""
    tensor = tensor.detach()
    return tensor.to("cpu", copy=True) if copy else tensor


def _shard_dict(file: str, name: str, piece: model_state.TablePiece, tensor: Tensor, rank: int) -> dict:
    s = piece.shard
    return {
        "file": file,
        "tensor": name,
        "row_offset": s.row_offset,
        "num_rows": s.num_rows,
        "col_offset": s.col_offset,
        "num_cols": s.num_cols,
        "shape": list(tensor.shape),
        "rank": rank,
    }


def _table_snapshot(model: nn.Module, rank: int, copy: bool) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """This rank's tensors (table shards and their optimizer state) and their partial manifest entries."""
    file, tensors, tables = rank_file(rank), {}, {}
    for key, table in model_state.local_tables(model).items():
        pieces = table.pieces if not table.replicated or rank == 0 else []
        entry = {
            "collection": table.collection,
            "name": table.name,
            "global_shape": list(table.global_shape),
            "sharding_type": table.sharding_type,
            "weight": {"kind": PER_ELEMENT, "dtype": None, "shards": []},
            "optimizer_state": {},
        }
        for piece in pieces:
            base = f"{key}/{piece.shard.row_offset}_{piece.shard.col_offset}"
            tensors[f"{base}/weight"] = _copy(piece.weight, copy)
            entry["weight"]["dtype"] = dtype_name(piece.weight.dtype)
            entry["weight"]["shards"].append(_shard_dict(file, f"{base}/weight", piece, piece.weight, rank))
            for name, state in piece.states.items():
                tensors[f"{base}/{name}"] = _copy(state, copy)
                kind = model_state.state_kind(name, state, piece.shard)
                slot = entry["optimizer_state"].setdefault(
                    name, {"kind": kind, "dtype": dtype_name(state.dtype), "shards": []}
                )
                slot["shards"].append(_shard_dict(file, f"{base}/{name}", piece, state, rank))
            if piece.counts is not None:
                tensors[f"{base}/{ROW_COUNTS}"] = _copy(piece.counts, copy)
                slot = entry.setdefault(
                    ROW_COUNTS, {"kind": PER_ROW, "dtype": dtype_name(torch.int32), "shards": []}
                )
                slot["shards"].append(_shard_dict(file, f"{base}/{ROW_COUNTS}", piece, piece.counts, rank))
        tables[key] = entry
    return tensors, tables


def _rng_snapshot(tensors: dict[str, Tensor]) -> dict[str, str]:
    names = {"torch_cpu": "rng/torch_cpu"}
    tensors["rng/torch_cpu"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        names["torch_cuda"] = "rng/torch_cuda"
        tensors["rng/torch_cuda"] = torch.cuda.get_rng_state()
    return names


def _dense_snapshot(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, copy: bool
) -> tuple[dict[str, Tensor], dict[str, Any], Any]:
    tensors, params = {}, {}
    for name, value in model_state.dense_state(model).items():
        tensors[f"model/{name}"] = _copy(value, copy)
        params[name] = {
            "tensor": f"model/{name}",
            "shape": list(value.shape),
            "dtype": dtype_name(value.dtype),
        }
    members = {
        name: flatten(member.state_dict(), f"optim/{name}", tensors, copy)
        for name, member in dense_optimizers(optimizer).items()
    }
    return tensors, params, (members or None)


def _check_json(name: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name} must be JSON-serialisable (no pickle in checkpoints): {e}") from None


def _snapshot(
    root: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    model_config: Any,
    extra: dict | None,
    env: ShardingEnv,
    copy: bool,
    data_position: dict | None = None,
) -> _Snapshot:
    if not isinstance(step, int) or step < 0:
        raise ConfigError(f"step must be a non-negative int, got {step!r}")
    config = model_config.to_dict() if hasattr(model_config, "to_dict") else model_config
    _check_json("extra", extra or {})
    _check_json("data_position", data_position)
    _check_json("model_config", config)
    tensors, tables = _table_snapshot(model, env.rank, copy)
    rng = _rng_snapshot(tensors)
    snapshot = _Snapshot(env.rank, root / f"{TMP_PREFIX}{step_dir_name(step)}", tensors, tables, rng)
    if env.rank == 0:
        dense, params, optim = _dense_snapshot(model, optimizer, copy)
        plan = getattr(model, "plan", None)
        snapshot.dense_tensors = dense
        snapshot.manifest_fields = {
            "step": step,
            "world_size": env.world_size,
            "plan": plan.to_dict() if plan is not None else None,
            "model_config": config,
            "prediction_prefix": model_state.prediction_prefix(model),
            "collections": model_state.collection_summary(model),
            "dense_params": params,
            "dense_optimizer": optim,
            "extra": dict(extra or {}),
            "data_position": data_position,
        }
    return snapshot


def _prepare(snapshot: _Snapshot, env: ShardingEnv) -> None:
    if env.rank == 0:
        shutil.rmtree(snapshot.tmp_dir, ignore_errors=True)
        snapshot.tmp_dir.mkdir(parents=True)
    barrier(env)


def _write(snapshot: _Snapshot) -> dict[str, Any]:
    """Write this rank's files; the payload every rank sends to rank 0 (an error string instead of raising,
    so that one rank's failure reaches all ranks rather than leaving them in a collective)."""
    try:
        files = {
            rank_file(snapshot.rank): write_safetensors(
                snapshot.tmp_dir / rank_file(snapshot.rank), snapshot.tensors
            )
        }
        if snapshot.dense_tensors is not None:
            files[DENSE_FILE] = write_safetensors(snapshot.tmp_dir / DENSE_FILE, snapshot.dense_tensors)
    except Exception as e:
        return {"error": f"rank {snapshot.rank}: {type(e).__name__}: {e}"}
    return {
        "files": {name: asdict(entry) for name, entry in files.items()},
        "tables": snapshot.tables,
        "rng": {str(snapshot.rank): {"file": rank_file(snapshot.rank), **snapshot.rng}},
    }


def _merge_tables(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for payload in payloads:
        for key, part in payload["tables"].items():
            fields = {k: v for k, v in part.items() if k != ROW_COUNTS}
            entry = merged.setdefault(
                key, {**fields, "weight": {**part["weight"], "shards": []}, "optimizer_state": {}}
            )
            entry["weight"]["shards"] += part["weight"]["shards"]
            entry["weight"]["dtype"] = entry["weight"]["dtype"] or part["weight"]["dtype"]
            for name, state in part["optimizer_state"].items():
                slot = entry["optimizer_state"].setdefault(name, {**state, "shards": []})
                slot["shards"] += state["shards"]
            if ROW_COUNTS in part:  # only ranks holding a counted shard of the table send counts
                slot = entry.setdefault(ROW_COUNTS, {**part[ROW_COUNTS], "shards": []})
                slot["shards"] += part[ROW_COUNTS]["shards"]
    for entry in merged.values():
        counts = [entry[ROW_COUNTS]] if entry.get(ROW_COUNTS) else []
        for state in [entry["weight"], *entry["optimizer_state"].values(), *counts]:
            state["shards"].sort(key=lambda s: (s["row_offset"], s["col_offset"]))
    return merged


def _finalize(snapshot: _Snapshot, payloads: list[dict[str, Any]], root: Path, keep_last: int) -> Path:
    """Rank 0: write the manifest, publish the directory, move ``latest``, prune old checkpoints."""
    fields = snapshot.manifest_fields
    data = {
        **fields,
        "format_version": 1,
        "created_unix": time.time(),
        "tables": _merge_tables(payloads),
        "files": {name: e for p in payloads for name, e in p["files"].items()},
        "rng": {rank: e for p in payloads for rank, e in p["rng"].items()},
    }
    manifest = Manifest.from_dict(data, f"{snapshot.tmp_dir / MANIFEST}")
    write_text_atomic(snapshot.tmp_dir / MANIFEST, manifest.to_json())
    final = root / step_dir_name(fields["step"])
    publish_dir(snapshot.tmp_dir, final)
    write_text_atomic(root / LATEST, final.name + "\n")
    prune(root, keep_last)
    return final


def commit(
    snapshot: _Snapshot, payload: dict[str, Any], env: ShardingEnv, root: Path, keep_last: int
) -> Path:
    """Gather every rank's payload and publish the checkpoint (collective; every rank gets the path)."""
    payloads = all_gather_object(env, payload)
    errors = [p["error"] for p in payloads if "error" in p]
    result: dict[str, str] = {}
    if env.rank == 0:
        if errors:
            shutil.rmtree(snapshot.tmp_dir, ignore_errors=True)
        else:
            try:
                result = {"path": str(_finalize(snapshot, payloads, root, keep_last))}
            except Exception as e:
                result = {"error": f"rank 0 could not publish the checkpoint: {type(e).__name__}: {e}"}
    result = broadcast_object(env, result)
    if errors or "error" in result:
        raise CheckpointError(f"saving {snapshot.tmp_dir} failed: {'; '.join(errors or [result['error']])}")
    logger.info("saved checkpoint %s", result["path"])
    return Path(result["path"])


def _check_keep_last(keep_last: int) -> None:
    if not isinstance(keep_last, int) or keep_last < 1:
        raise ConfigError(f"keep_last must be an int >= 1, got {keep_last!r}")


def save_checkpoint(
    dir: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int,
    model_config: Any = None,
    extra: dict | None = None,
    env: ShardingEnv | None = None,
    keep_last: int = 3,
    data_position: dict | None = None,
) -> Path:
    """Save ``model`` (a DMP or a plain module) and ``optimizer`` as ``<dir>/step_<step>``.

    Collective: every rank calls it. ``optimizer`` may combine dense optimizers and fused embedding
    optimizers (whose state is saved with the table shards). ``extra`` (JSON), ``data_position`` (a
    ``DataPosition.to_dict()``: how much data the job consumed) and ``model_config`` (its ``to_dict()``) go
    into the manifest. Returns the step directory.
    """
    _check_keep_last(keep_last)
    root, env = Path(dir), resolve_env(model, env)
    snapshot = _snapshot(root, model, optimizer, step, model_config, extra, env, False, data_position)
    _prepare(snapshot, env)
    return commit(snapshot, _write(snapshot), env, root, keep_last)


class AsyncCheckpointSave:
    """A save in progress: the files are written by a background thread from a host-memory snapshot.

    ``wait()`` joins the writer and publishes the checkpoint; it is collective (every rank calls it, from the
    training thread, before the next save) and returns the step directory. ``done()`` tells whether the files
    are written.
    """

    def __init__(self, snapshot: _Snapshot, env: ShardingEnv, root: Path, keep_last: int) -> None:
        self._snapshot, self._env, self._root, self._keep_last = snapshot, env, root, keep_last
        self._payload: dict[str, Any] = {}
        self._path: Path | None = None
        self._thread = threading.Thread(target=self._run, name="rectrain-checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._payload = _write(self._snapshot)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> Path:
        if self._path is None:
            self._thread.join()
            self._path = commit(self._snapshot, self._payload, self._env, self._root, self._keep_last)
        return self._path


def save_checkpoint_async(
    dir: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int,
    model_config: Any = None,
    extra: dict | None = None,
    env: ShardingEnv | None = None,
    keep_last: int = 3,
    data_position: dict | None = None,
) -> AsyncCheckpointSave:
    """Like :func:`save_checkpoint`, but returns once the state is copied to host memory; training may go on
    while a background thread writes. Call ``.wait()`` on every rank to publish it."""
    _check_keep_last(keep_last)
    root, env = Path(dir), resolve_env(model, env)
    snapshot = _snapshot(root, model, optimizer, step, model_config, extra, env, True, data_position)
    _prepare(snapshot, env)
    return AsyncCheckpointSave(snapshot, env, root, keep_last)
