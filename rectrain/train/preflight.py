"""Checks before the first step: every path a run uses, so that no mistake is found after hours of training.

Each check raises ``ConfigError`` with one line naming the config key, the path and the fix: data and
evaluation files exist and are files, the checkpoint directory and the metrics log can be created and
written, a plan file exists, and ``resume = false`` does not write beside the checkpoints of another run.
"""

from __future__ import annotations

import os
from pathlib import Path

from rectrain.datasets.rows import DataFileError, check_data_file
from rectrain.errors import ConfigError
from rectrain.train.config import RunConfig


def check_run_paths(config: RunConfig, *, training: bool = True) -> None:
    """Check the paths of ``config``; ``training=False`` (``rectrain eval``) checks what evaluation reads."""
    src, data = config.source, config.data
    keys = [("data.eval_paths", data.eval_paths)] if data.eval_paths else [("data.paths", data.paths)]
    if training and data.eval_paths:
        keys.insert(0, ("data.paths", data.paths))
    for key, paths in keys:
        for path in paths:
            try:
                check_data_file(path, f"{src}: {key}: file")
            except DataFileError as e:
                raise ConfigError(str(e)) from None
    plan_file = config.planner.plan_file
    if plan_file and not Path(plan_file).is_file():
        raise ConfigError(
            f"{src}: planner.plan_file: {plan_file} does not exist; write one with `rectrain plan --out`"
        )
    if not training:
        return
    if config.checkpoint.dir:
        _check_writable_dir(Path(config.checkpoint.dir), f"{src}: checkpoint.dir")
        _check_fresh_start(config)
    if config.train.metrics_log:
        _check_writable_file(Path(config.train.metrics_log), f"{src}: train.metrics_log")


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_writable_dir(path: Path, key: str) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {path} is a file, not a directory; give a directory for the checkpoints")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise ConfigError(f"{key}: {path} cannot be created ({existing} is a file); choose another directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: {existing} is not writable by this user; choose a directory you can write")


def _check_writable_file(path: Path, key: str) -> None:
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a directory; give a file path such as {path / 'metrics.jsonl'}")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{key}: {path} is not writable by this user; choose another file")
        return
    _check_writable_dir(path.parent, key)


def _check_fresh_start(config: RunConfig) -> None:
    """``resume = false`` into a directory holding checkpoints needs ``--overwrite`` (or another one)."""
    from rectrain.train.checkpointing import has_checkpoint, saved_checkpoints

    ckpt, src = config.checkpoint, config.source
    if ckpt.resume or ckpt.overwrite or not Path(ckpt.dir).is_dir():
        return
    existing = saved_checkpoints(ckpt.dir)
    if existing or has_checkpoint(ckpt.dir):
        raise ConfigError(
            f"{src}: checkpoint.resume = false but {ckpt.dir} already holds checkpoints "
            f"({', '.join(existing)}); pass --overwrite to replace them, choose another checkpoint.dir, "
            "or set checkpoint.resume = true"
        )
