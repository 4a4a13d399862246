"""Checks before the first step: every path a run uses, so that no mistake is found after hours of training.

Each check raises ``ConfigError`` with one line naming the config key, the path and the fix: data and
evaluation files exist and are files that start like the source's rows (``sniff``; converted data: directories
with a manifest, whose parts' sha256 the ranks check between them), the checkpoint directory and the metrics
log can be created and written (tried, not asked), a plan file exists, ``resume = false`` does not write
beside the checkpoints of another run, and a resume continues on the data its checkpoints were trained on.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from rectrain.datasets.columnar import ColumnarManifest, DataFormatError
from rectrain.datasets.rows import DataFileError, check_data_file
from rectrain.datasets.sniff import sniff_text_file
from rectrain.durable import sha256_file
from rectrain.errors import ConfigError, RecTrainError
from rectrain.train.config import RunConfig
from rectrain.train.tensorboard import summary_writer_class

logger = logging.getLogger(__name__)

_TEXT_SOURCES = {"criteo": "Criteo TSV", "movielens": "MovieLens ratings"}


def check_run_paths(config: RunConfig, *, training: bool = True) -> None:
    """Check the paths of ``config``; ``training=False`` (``rectrain eval``) checks what evaluation reads."""
    src, data = config.source, config.data
    if not training and data.follow and not data.eval_paths:
        raise ConfigError(
            f"{src}: data.eval_paths: a followed directory has no held-out split (its runs are evaluated "
            "progressively, see the metrics log); give data.eval_paths to evaluate a checkpoint"
        )
    keys = [("data.eval_paths", data.eval_paths)] if data.eval_paths else [("data.paths", data.paths)]
    if training and data.eval_paths:
        keys.insert(0, ("data.paths", data.paths))
    for key, paths in keys:
        if key == "data.paths" and data.follow:
            _check_followed_directory(paths[0], f"{src}: data.paths")
            continue
        for path in paths:
            _check_data_path(config, path, f"{src}: {key}")
    plan_file = config.planner.plan_file
    if plan_file and not Path(plan_file).is_file():
        raise ConfigError(
            f"{src}: planner.plan_file: {plan_file} does not exist; write one with `rectrain plan --out`"
        )
    if not training:
        return
    ckpt_dir, log = config.checkpoint.dir, config.train.metrics_log
    if ckpt_dir:
        _check_writable_dir(Path(ckpt_dir), f"{src}: checkpoint.dir")
        _check_fresh_start(config)
        _check_same_data(config)
    if log:
        _check_writable_file(Path(log), f"{src}: train.metrics_log")
    board = config.train.tensorboard_dir
    if board:
        summary_writer_class(f"{src}: train.tensorboard_dir")
        _check_writable_dir(Path(board), f"{src}: train.tensorboard_dir")
    # Then write where the run will write (os.access says yes to root even under /proc), creating the
    # directories, which are left for the run.
    if ckpt_dir:
        _probe_dir(Path(ckpt_dir), f"{src}: checkpoint.dir")
    if log:
        _probe_file(Path(log), f"{src}: train.metrics_log")
    if board:
        _probe_dir(Path(board), f"{src}: train.tensorboard_dir")


def check_converted_parts(config: RunConfig, rank: int = 0, world_size: int = 1) -> None:
    """Converted data, once per run: every part's size, and the sha256 of this rank's share of the parts
    (parts ``rank``, ``rank + world_size``, ...), so a damaged part is named before the first step."""
    if config.data.source != "converted":
        return
    start, parts = time.perf_counter(), []
    followed = [] if config.data.follow else config.data.paths  # a followed directory's arrive later
    for location in dict.fromkeys([*followed, *config.data.eval_paths]):
        try:
            manifest, directory = ColumnarManifest.load(location)
            manifest.check_files(directory)
        except DataFormatError as e:
            key = "data.paths" if location in config.data.paths else "data.eval_paths"
            raise ConfigError(f"{config.source}: {key}: {e}") from None
        parts += [(directory / p.path, p.sha256) for p in manifest.parts]
    for path, digest in parts[rank::world_size]:
        if sha256_file(path) != digest:
            raise ConfigError(
                f"{config.source}: data: {path} does not match the sha256 its manifest records (altered or "
                "damaged); convert the data again (`rectrain data verify DIR` checks every part)"
            )
    logger.info(
        "checked the sha256 of %d of %d converted parts in %.1f s",
        len(parts[rank::world_size]),
        len(parts),
        time.perf_counter() - start,
    )


def _check_followed_directory(path: str, where: str) -> None:
    """``data.follow``'s directory exists (its files are checked as they arrive: it may start empty)."""
    if not Path(path).is_dir():
        state = "is not a directory" if Path(path).exists() else "does not exist"
        raise ConfigError(
            f"{where}: {path} {state}; data.follow reads the files that arrive in one directory: create it "
            "(files are renamed into it when complete)"
        )


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_data_path(config: RunConfig, path: str, where: str) -> None:
    """A data file exists (text files start like the source's rows: ``sniff``); converted data are a
    directory (or its manifest.json) with a readable manifest."""
    try:
        if config.data.source == "converted":
            ColumnarManifest.load(path)
        elif config.data.source in _TEXT_SOURCES:
            kind = _TEXT_SOURCES[config.data.source]
            sniff_text_file(path, f"{where}: file", _line_parser(config, path), kind)
        else:
            check_data_file(path, f"{where}: file")
    except (DataFileError, DataFormatError) as e:
        raise ConfigError(f"{where}: {e}" if config.data.source == "converted" else str(e)) from None


def _line_parser(config: RunConfig, path: str) -> Callable[[str, str], object]:
    """The source's own line parser (``RowError`` for a line that is not a row)."""
    from rectrain.datasets import build_dataset
    from rectrain.train.data import source_config

    return build_dataset(source_config(config, [path])).parse_line


def _check_writable_dir(path: Path, key: str) -> None:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {path} is a file, not a directory; give a directory")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise ConfigError(f"{key}: {path} cannot be created ({existing} is a file); choose another directory")


def _check_writable_file(path: Path, key: str) -> None:
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a directory; give a file path such as {path / 'metrics.jsonl'}")
    if not path.exists():
        _check_writable_dir(path.parent, key)


def _probe_dir(path: Path, key: str) -> None:
    """Create ``path`` and a file in it (then remove the file); ConfigError naming the key if that fails."""
    probe = path / f".write-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"{key}: cannot write in {path} ({e.strerror}); choose a directory this user can write"
        ) from None


def _probe_file(path: Path, key: str) -> None:
    """Open ``path`` for appending as the run will; a file not there yet is tried through a probe beside it,
    named per process, since every rank checks while rank 0 may already be writing the log."""
    try:
        if path.exists():
            with open(path, "a"):
                pass
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".{path.name}.write-probe-{socket.gethostname()}-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(
            f"{key}: cannot write {path} ({e.strerror}); choose a file this user can write"
        ) from None


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


def _check_same_data(config: RunConfig) -> None:
    """A resume continues the run on the data its checkpoints were trained on; on other data it is refused
    (``--overwrite`` starts afresh instead)."""
    from rectrain.checkpoint.manifest import read_manifest
    from rectrain.train.checkpointing import DATA, data_identity, has_checkpoint, starts_afresh

    ckpt = config.checkpoint
    if starts_afresh(config) or not has_checkpoint(ckpt.dir):
        return
    try:
        recorded = read_manifest(ckpt.dir).extra.get(DATA)
    except RecTrainError:
        return  # the resume reports a damaged checkpoint
    current = data_identity(config)
    if recorded is None or recorded == current:  # None: written before checkpoints recorded their data
        return
    raise ConfigError(
        f"{config.source}: data.paths: {ckpt.dir} holds the checkpoints of a run on other data "
        f"({_difference(recorded, current)}); pass --overwrite to start afresh there, choose another "
        "checkpoint.dir, or train on the run's data"
    )


def _difference(recorded: dict, current: dict) -> str:
    """The first difference between two ``data_identity`` records, in words."""
    if recorded.get("source") != current.get("source"):
        return f"data.source was {recorded.get('source')!r}, now {current.get('source')!r}"
    if recorded.get("follow", False) != current.get("follow", False):
        return f"data.follow was {recorded.get('follow', False)}, now {current.get('follow', False)}"
    old, new = recorded.get("paths", []), current.get("paths", [])
    if [p for p, _ in old] != [p for p, _ in new]:
        return f"data.paths were {[p for p, _ in old]}"
    path, was, now = next((p, a, b) for (p, a), (_, b) in zip(old, new) if a != b)
    return f"{path} had {was:,} bytes or rows, now {now:,}" if None not in (was, now) else f"{path} changed"
