"""The run's data: a rank's training stream and its held-out evaluation batches, built from a ``RunConfig``.

The dataset's shape is taken from the model: the dense width is ``model.dense_in_features`` and each
feature's id range is the row count of the table that reads it. Each training batch comes with the data
position once it is trained (``PositionedBatch``), which a checkpoint records:

- file sources (``criteo``, ``movielens``, ``converted``, ``parquet``) are read in global windows
  (``rectrain.datasets.windows``): the position is (epoch, rows of the epoch consumed; for a shuffled
  columnar source, positions in that epoch's order), the same on every rank and for any number of ranks, so
  a run resumed on another world size continues with the next row;
- synthetic batches are made per rank from (seed, rank, index): the position counts each rank's batches.
- a followed directory (``data.follow``, ``rectrain.datasets.follow``) is read file by file, each file in
  its own global windows: the position is (the file being read, its rows consumed); while no file is new
  the stream yields ``WAITING`` (the ranks agree on it step by step, ``rectrain.train.sync``).

Held-out split: synthetic evaluation batches come from "virtual ranks" ``world_size .. 2 * world_size - 1``
(the same hidden task, examples no training rank sees); file sources use ``eval_paths`` when given, else
every ``holdout_every``-th block of ``batch_size`` rows (counted from the start of the epoch) is kept out of
training and read, in windows, for evaluation. A followed directory trains on every row: its evaluation is
progressive (``rectrain.train.progressive``), plus ``eval_paths`` when given.
"""

from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from torch.utils.data import DataLoader, IterableDataset

from rectrain.datasets import CriteoConfig, MovieLensConfig, SyntheticConfig, build_dataset
from rectrain.datasets.criteo import DEFAULT_CAT_NAMES, NUM_DENSE
from rectrain.datasets.factory import DatasetConfig
from rectrain.datasets.follow import WAITING, FileBatch, FollowConfig, Waiting, follow
from rectrain.datasets.movielens import FEATURE_NAMES as MOVIELENS_FEATURES
from rectrain.datasets.prefetch import Prefetcher
from rectrain.datasets.windows import BATCHES, ROWS, BatchAt, DataPosition, Holdout, Windowed
from rectrain.errors import ConfigError, RecTrainError
from rectrain.models.batch import Batch
from rectrain.train.columnar_data import columnar_dataset_config
from rectrain.train.config import RunConfig
from rectrain.train.features import feature_rows, require_features

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Sources whose batches are cheaper to read than to send from another process: read by the prefetch thread.
_READ_IN_PROCESS = ("converted", "parquet")
# How DataLoader workers start (see ``_loader``), and what the fork server imports once for all of them: a
# worker forked from it starts in milliseconds instead of importing torch anew (seconds), which a DataLoader
# pays per epoch (a small file read for many epochs spent minutes starting workers).
_WORKER_START = "forkserver"
_WORKER_PRELOAD = ["__main__", "torch.utils.data", "rectrain.datasets"]


@dataclass
class PositionedBatch:
    """A training batch and the job's data position once every rank has trained its batch of this step."""

    batch: Batch
    position: DataPosition


@dataclass(frozen=True)
class RunData:
    """A rank's data: ``train_batches(position)`` (its stream from a position on) and ``eval_batches()``."""

    config: RunConfig
    rank: int
    world_size: int

    @property
    def unit(self) -> str:
        """How this run's data position counts: rows of files, or batches per rank (synthetic)."""
        return BATCHES if self.config.data.source == "synthetic" else ROWS

    def initial_position(self) -> DataPosition:
        return DataPosition(0, 0, self.unit, self.config.data.source)

    @property
    def evaluates(self) -> bool:
        """Whether the run has a held-out split (a followed directory has one only with ``eval_paths``)."""
        return not self.config.data.follow or bool(self.config.data.eval_paths)

    def train_batches(self, start: DataPosition | None = None) -> Iterator[PositionedBatch | Waiting]:
        """This rank's training batches from ``start`` (``epochs`` passes, else endless).

        A position counted in batches on a file source (a checkpoint without a global position, written by
        an older rectrain) skips that many batches of this rank's stream, as those versions did.
        """
        start = start or self.initial_position()
        data = self.config.data
        if data.source == "synthetic":
            if start.unit != BATCHES:
                raise ConfigError(
                    f"{self.config.source}: data.source: the checkpoint's data position counts rows of "
                    f"{start.source or 'files'}; synthetic data cannot continue from it"
                )
            return self._counted(self._synthetic_batches(start.offset), start.offset)
        if data.follow:
            return self._followed_batches(start)
        if start.unit == BATCHES:
            stream = self._file_batches(self.initial_position())
            return itertools.islice(stream, start.offset, None)
        return self._file_batches(start)

    def _file_batches(self, start: DataPosition) -> Iterator[PositionedBatch]:
        data, epochs = self.config.data, self.config.train.epochs
        dataset_config = source_config(self.config, data.paths)
        select = self._holdout(held_out=False)
        passes = range(start.epoch, epochs) if epochs is not None else itertools.count(start.epoch)
        for epoch in passes:
            offset = start.offset if epoch == start.epoch else 0
            dataset = build_dataset(
                dataset_config, self.rank, self.world_size, start_row=offset, select=select, epoch=epoch
            )
            empty = True
            for item in _loader(Windowed(dataset), self._num_workers(), data.prefetch):
                empty = False
                yield PositionedBatch(item.batch, DataPosition(epoch, item.end, ROWS, data.source))
            if empty and offset == 0:
                raise ConfigError(f"{self.config.source}: data.paths: epoch {epoch} gave no training rows")

    def _followed_batches(self, start: DataPosition) -> Iterator[PositionedBatch | Waiting]:
        data = self.config.data
        if start.unit != ROWS or (start.offset and not start.file):
            raise ConfigError(
                f"{self.config.source}: data.follow: the checkpoint's data position ({start}) is not a "
                "followed directory's; resume with the data it was trained on, or start afresh "
                "(checkpoint.resume = false)"
            )
        follow_config = FollowConfig(data.paths[0], data.follow_poll_s, data.follow_idle_stop_s)
        for item in follow(follow_config, self._read_followed_file, start.file, start.offset):
            if item is WAITING:
                yield WAITING
            else:
                assert isinstance(item, FileBatch)
                yield PositionedBatch(item.batch, DataPosition(0, item.end, ROWS, data.source, item.file))

    def _read_followed_file(self, path: Path, start_row: int) -> Iterable[BatchAt]:
        """One arrived file's windows for this rank from ``start_row``, read as the source's files are."""
        data = self.config.data
        dataset = build_dataset(
            source_config(self.config, [str(path)]), self.rank, self.world_size, start_row=start_row
        )
        return _loader(Windowed(dataset), self._num_workers(), data.prefetch)

    def _synthetic_batches(self, start: int) -> Iterator[Batch]:
        data, train = self.config.data, self.config.train
        dataset_config = source_config(self.config, [])
        if data.num_workers == 0:
            return _synthetic_stream(self.config, dataset_config, self.rank, self.world_size, start)
        dataset = build_dataset(dataset_config, self.rank, self.world_size)
        stream = _epochs(dataset, data.num_workers, data.prefetch, train.epochs, self.config.source)
        return itertools.islice(stream, start, None)

    def _counted(self, batches: Iterable[Batch], start: int) -> Iterator[PositionedBatch]:
        source = self.config.data.source
        for i, batch in enumerate(batches, start=start + 1):
            yield PositionedBatch(batch, DataPosition(0, i, BATCHES, source))

    def _num_workers(self) -> int:
        """DataLoader worker processes for this run's file source (see ``_READ_IN_PROCESS``)."""
        data = self.config.data
        if data.source not in _READ_IN_PROCESS or data.num_workers == 0:
            return data.num_workers
        _say_read_in_process(data.source, data.num_workers)
        return 0

    def _holdout(self, held_out: bool) -> Holdout | None:
        if not _holds_out_batches(self.config):
            return None
        return Holdout(self.config.data.holdout_every, self.config.train.batch_size, held_out=held_out)

    def eval_batches(self) -> Iterator[Batch]:
        """The first ``train.eval_batches`` held-out batches of this rank (the same ones every time)."""
        data, count = self.config.data, self.config.train.eval_batches
        if data.source == "synthetic":
            dataset_config = replace(source_config(self.config, []), num_batches=count)
            dataset = build_dataset(dataset_config, self.rank + self.world_size, 2 * self.world_size)
            return iter(dataset)
        if not self.evaluates:
            return iter(())
        paths = data.eval_paths or data.paths
        dataset = build_dataset(
            source_config(self.config, paths), self.rank, self.world_size, select=self._holdout(True)
        )
        return itertools.islice(iter(_loader(dataset, self._num_workers(), data.prefetch)), count)


@functools.cache
def _say_read_in_process(source: str, num_workers: int) -> None:
    logger.info(
        "data.num_workers=%d: %s data is read by the prefetch thread instead (a batch takes ~0.1 ms to read, "
        "longer to send from a worker process)",
        num_workers,
        source,
    )


def _holds_out_batches(config: RunConfig) -> bool:
    data = config.data
    return data.source != "synthetic" and not data.eval_paths and not data.follow


def _loader(dataset: IterableDataset, num_workers: int, prefetch: int) -> Iterable[Batch]:
    """One pass over ``dataset``: read ahead by a thread, or by DataLoader worker processes."""
    if num_workers == 0:
        return Prefetcher(dataset, prefetch) if prefetch else dataset
    depth = {"prefetch_factor": prefetch} if prefetch else {}
    # Workers come from a fork server, not forked from the training process: a forked worker shares the
    # model's tables copy-on-write, and every page an optimizer step then writes first is copied at a page
    # fault (measured: ~3,400 faults and 60-80 ms of system time per step of DLRM on 26 x 100k x 64 tables).
    context = multiprocessing.get_context(_WORKER_START)
    context.set_forkserver_preload(_WORKER_PRELOAD)  # takes effect when the fork server first starts
    loader = DataLoader(
        dataset, batch_size=None, num_workers=num_workers, multiprocessing_context=context, **depth
    )
    return _from_workers(loader)


def _from_workers(loader: DataLoader) -> Iterator[Batch]:
    """The loader's batches; a worker's data error is raised in one line, as the reader in this process
    raises it.

    DataLoader re-raises a worker's exception by rebuilding it from a message that carries the worker's
    traceback (as a RuntimeError where the signature does not allow that, as MalformedRowError's).
    """
    try:
        yield from loader
    except Exception as e:
        text = str(e).strip()
        name, _, message = text.splitlines()[-1].partition(": ") if text else ("", "", "")
        if name.endswith("MalformedRowError"):
            raise RecTrainError(f"malformed row (strict): {message}") from None
        if isinstance(e, RecTrainError) and "\n" in text:  # DataFileError, DataFormatError
            raise type(e)(message) from None
        raise


def _epochs(
    dataset: IterableDataset, num_workers: int, prefetch: int, epochs: int | None, source: str
) -> Iterator[Batch]:
    passes = range(epochs) if epochs is not None else itertools.count()
    for epoch in passes:
        empty = True
        for batch in _loader(dataset, num_workers, prefetch):
            empty = False
            yield batch
        if empty:
            raise ConfigError(f"{source}: data.paths: epoch {epoch} gave this rank no batches")


def first_batches(stream: Iterable[T], count: int) -> Iterator[T]:
    """The items of ``stream`` up to its ``count``-th batch: ``WAITING`` items pass without counting."""
    if count <= 0:
        return
    for item in stream:
        yield item
        if not isinstance(item, Waiting):
            count -= 1
            if count == 0:
                return


def _synthetic_stream(
    config: RunConfig, dataset_config: SyntheticConfig, rank: int, world_size: int, start: int
) -> Iterator[Batch]:
    """Synthetic batches by index (each a pure function of seed, rank, index): a resume skips for free."""
    train = config.train
    per_epoch = config.data.num_batches or train.steps or 1
    dataset = build_dataset(replace(dataset_config, num_batches=per_epoch), rank, world_size)
    end = per_epoch * train.epochs if train.epochs is not None else None
    indices = itertools.count(start) if end is None else range(start, end)
    return (dataset.batch(i % per_epoch) for i in indices)


def source_config(config: RunConfig, paths: list[str]) -> DatasetConfig:
    """The dataset config of ``config``'s source reading ``paths``, sized from the model's tables."""
    data, model, src = config.data, config.model, config.source
    rows = feature_rows(config)
    batch_size = config.train.batch_size
    if data.source in ("converted", "parquet"):
        return columnar_dataset_config(config, paths, rows)
    if data.source == "synthetic":
        names = [f"cat_{i}" for i in range(len(rows))]
        require_features(src, "synthetic data", names, rows, exact=True)
        return SyntheticConfig(
            batch_size=batch_size,
            num_batches=data.num_batches or 1,
            num_dense=model.dense_in_features,
            num_sparse=len(names),
            num_embeddings=[rows[n] for n in names],
            ids_per_feature=(data.ids_per_feature[0], data.ids_per_feature[1]),
            distribution=data.distribution,
            zipf_alpha=data.zipf_alpha,
            signal=data.signal,
            seed=config.train.seed,
        )
    if data.source == "criteo":
        if model.dense_in_features != NUM_DENSE:
            raise ConfigError(
                f"{src}: model.dense_in_features: Criteo rows have {NUM_DENSE} integer features, "
                f"got {model.dense_in_features}"
            )
        require_features(src, "Criteo rows", DEFAULT_CAT_NAMES, rows, exact=True)
        return CriteoConfig(
            paths=list(paths),
            batch_size=batch_size,
            num_embeddings=[rows[n] for n in DEFAULT_CAT_NAMES],
            strict=data.strict,
        )
    require_features(src, "MovieLens ratings", MOVIELENS_FEATURES, rows, exact=False)
    return MovieLensConfig(
        paths=list(paths),
        batch_size=batch_size,
        num_user_embeddings=rows["user_id"],
        num_movie_embeddings=rows["movie_id"],
        threshold=data.threshold,
        strict=data.strict,
    )
