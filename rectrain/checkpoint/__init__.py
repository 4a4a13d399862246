"""Sharded checkpoints in safetensors: atomic saves, exact resume, re-sharding on load, full state for export.

``save_checkpoint`` / ``load_checkpoint`` work on a ``DistributedModelParallel`` or a plain module; the
format is described in ``docs/checkpoint-format.md`` and in ``rectrain.checkpoint.manifest``.
"""

from rectrain.checkpoint.errors import CheckpointError, CheckpointMismatchError
from rectrain.checkpoint.load import CheckpointInfo, load_checkpoint, load_full_state
from rectrain.checkpoint.manifest import FORMAT_VERSION, Manifest, read_manifest
from rectrain.checkpoint.save import AsyncCheckpointSave, save_checkpoint, save_checkpoint_async

__all__ = [
    "FORMAT_VERSION",
    "AsyncCheckpointSave",
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointMismatchError",
    "Manifest",
    "load_checkpoint",
    "load_full_state",
    "read_manifest",
    "save_checkpoint",
    "save_checkpoint_async",
]
