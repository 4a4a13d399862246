"""Which checkpoints a directory keeps: keep-last by save time, deletes that survive a kill, leftovers.

``prune`` (after every save) keeps the ``keep_last`` most recently saved checkpoints and the one ``latest``
names. A checkpoint is renamed to a ``.tmp_`` name before it is deleted, so a kill during the clean-up never
leaves a ``step_N`` directory without its manifest; ``remove_leftovers`` (at the start of a training job)
clears what interrupted saves and deletes left behind.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from pathlib import Path

from rectrain.checkpoint.manifest import LATEST, MANIFEST, STEP_PREFIX

logger = logging.getLogger(__name__)

TMP_PREFIX = ".tmp_"


def _complete_checkpoints(root: Path) -> list[Path]:
    return [
        path
        for path in root.glob(f"{STEP_PREFIX}*")
        if path.name[len(STEP_PREFIX) :].isdigit() and (path / MANIFEST).is_file()
    ]


def _saved_at(path: Path) -> tuple[float, int]:
    """When the checkpoint at ``path`` was saved (its manifest's ``created_unix``, else the file's mtime)."""
    manifest = path / MANIFEST
    try:
        created = float(json.loads(manifest.read_text()).get("created_unix") or 0.0)
    except (OSError, ValueError, AttributeError, TypeError):
        created = 0.0
    if not created:
        created = manifest.stat().st_mtime if manifest.exists() else 0.0
    return created, int(path.name[len(STEP_PREFIX) :])


def _delete(path: Path) -> None:
    """Remove a directory so that a kill midway leaves a ``.tmp_`` leftover, not a half-deleted checkpoint."""
    doomed = path.with_name(f"{TMP_PREFIX}deleting_{path.name}_{secrets.token_hex(4)}")
    try:
        os.replace(path, doomed)
    except FileNotFoundError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(root: Path) -> list[Path]:
    """Remove what interrupted saves and deletes left in ``root``: ``.tmp_*`` and ``.old_*`` directories and
    ``step_*`` directories without a manifest. Call it when no save is running (at the start of a job)."""
    leftovers = [*root.glob(f"{TMP_PREFIX}*"), *root.glob(".old_*")]
    leftovers += [p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir() and not (p / MANIFEST).is_file()]
    pointed = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    leftovers = [p for p in leftovers if p.name != pointed]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if leftovers:
        names = sorted(p.name for p in leftovers)
        logger.info("removed leftovers of interrupted saves in %s: %s", root, names)
    return leftovers


def remove_checkpoints(root: Path) -> list[str]:
    """Delete every checkpoint of ``root`` and its ``latest`` pointer (``--overwrite``); their names."""
    names = sorted(p.name for p in _complete_checkpoints(root))
    (root / LATEST).unlink(missing_ok=True)
    for name in names:
        _delete(root / name)
    remove_leftovers(root)
    return names


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the ``keep_last`` most recently saved checkpoints (by save time, not step number; never
    the one ``latest`` names) and the leftovers of interrupted saves."""
    pointed = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    steps = sorted(_complete_checkpoints(root), key=_saved_at)
    for path in steps[: max(0, len(steps) - keep_last)]:
        if path.name != pointed:
            _delete(path)
    for path in root.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)
