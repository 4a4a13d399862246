"""A directory that keeps growing, read file by file in name order: the data of a run that never ends.

The arrival rule: a file is complete when its name appears in the directory. Producers write it elsewhere
(or in the directory under a dot-name or a ``.tmp`` suffix) and rename it into place; dot-names and ``*.tmp``
are never read. Files are read once each, in name order, so names must sort in arrival order (a timestamp
or a zero-padded sequence number); a name that appears after a later-sorting file was started is an error,
never read out of order or skipped silently.

Each file is read in the global windows of ``rectrain.datasets.windows`` (rows numbered from 0 in the file,
rank ``r`` of ``W`` taking its block of every ``W x B`` rows), so the position, ``(file, rows of it
consumed)``, is the same on every rank and for any number of ranks. When no new file is there the stream
yields ``WAITING`` every ``poll_s`` (the trainer agrees with its peers on it, see ``rectrain.train.sync``),
and ends after ``idle_stop_s`` without data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rectrain.datasets.rows import DataFileError
from rectrain.datasets.windows import BatchAt

logger = logging.getLogger(__name__)

TEMPORARY_SUFFIX = ".tmp"


class Waiting:
    """The stream's item while no new file has arrived (one per poll)."""

    def __repr__(self) -> str:
        return "WAITING"


WAITING = Waiting()


@dataclass
class FileBatch:
    """A batch of file ``file`` and the row index in that file after its window (``BatchAt.end``)."""

    batch: object
    file: str
    end: int


@dataclass(frozen=True)
class FollowConfig:
    """``directory`` to follow; ``poll_s`` between listings when idle; ``idle_stop_s``: end after that long
    without data (None: never)."""

    directory: str
    poll_s: float = 1.0
    idle_stop_s: float | None = None


def is_complete(name: str) -> bool:
    """Whether a directory entry named ``name`` is a finished file (the arrival rule)."""
    return not name.startswith(".") and not name.endswith(TEMPORARY_SUFFIX)


def arrived(directory: str | Path) -> list[str]:
    """The complete entries of ``directory``, in name order; ``DataFileError`` when it is not readable."""
    try:
        return sorted(name for name in (p.name for p in Path(directory).iterdir()) if is_complete(name))
    except OSError as e:
        raise DataFileError(f"data.paths: cannot list the followed directory {directory}: {e}") from None


class DirectoryFollower:
    """The names of the files to read after ``current``, in order, as they arrive; checks the name order."""

    def __init__(self, directory: str | Path, current: str = "") -> None:
        self.directory = Path(directory)
        self.current = current
        self._seen: set[str] | None = None  # names listed before (None: not listed yet)

    def next_file(self) -> str | None:
        """The first complete name after ``current`` (which it becomes), or None when there is none yet."""
        names = arrived(self.directory)
        if self._seen is not None:
            late = [n for n in names if n not in self._seen and n <= self.current]
            if late:
                raise DataFileError(
                    f"data.paths: {self.directory / late[0]} arrived after {self.current} was started but "
                    "sorts before it; files are read once, in name order: name files so that they sort in "
                    "arrival order (e.g. a timestamp or zero-padded sequence number)"
                )
        self._seen = set(names)
        following = next((n for n in names if n > self.current), None)
        if following is not None:
            self.current = following
        return following


ReadFile = Callable[[Path, int], Iterable[BatchAt]]


def follow(
    config: FollowConfig,
    read_file: ReadFile,
    start_file: str = "",
    start_row: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[FileBatch | Waiting]:
    """This rank's batches of every file of ``config.directory`` from ``start_file``'s row ``start_row`` on
    (``read_file(path, first_row)`` reads one file's windows), ``WAITING`` every ``poll_s`` while no file
    is new, until ``idle_stop_s`` passes without data.
    """
    follower = DirectoryFollower(config.directory, start_file)
    name: str | None = start_file or None
    row = start_row
    last_data = clock()
    while True:
        if name is not None:
            path = Path(config.directory) / name
            if path.exists():
                for item in read_file(path, row):
                    last_data = clock()
                    yield FileBatch(item.batch, name, item.end)
                logger.info("data.paths: finished %s", path)
            else:  # a resumed position whose file was removed since
                logger.warning("data.paths: %s (the checkpoint's current file) is gone; going on", path)
            last_data = clock()
        name, row = follower.next_file(), 0
        while name is None:
            if config.idle_stop_s is not None and clock() - last_data >= config.idle_stop_s:
                idle = config.idle_stop_s
                logger.info("data.paths: no new file for %.1f s (data.follow_idle_stop_s): ending", idle)
                return
            time.sleep(config.poll_s)
            yield WAITING
            name = follower.next_file()
