"""``torchrec.datasets.utils`` at rectrain's path: the ``Batch`` every dataset yields, and TorchRec's
IterDataPipe helpers (train/validation splits, ``limit``, CSV lines, file loading, parallel reads).

The helpers live in this module itself (not re-exported) because code patches their lookups here
(``get_worker_info`` for a DataLoader worker's identity, ``random.Random`` for the split's generator).
"""

import csv
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import IO, Any

from torch.utils.data import IterDataPipe, functional_datapipe, get_worker_info

from rectrain.datasets.npy_files import PATH_MANAGER_KEY, open_file
from rectrain.models.batch import Batch

__all__ = [
    "PATH_MANAGER_KEY",
    "Batch",
    "Limit",
    "LoadFiles",
    "ParallelReadConcat",
    "ReadLinesFromCSV",
    "idx_split_train_val",
    "rand_split_train_val",
    "safe_cast",
    "train_filter",
    "val_filter",
]


def safe_cast(val: Any, dest_type: Callable[[Any], Any], default: Any) -> Any:
    """``dest_type(val)``, or ``default`` when ``val`` does not parse."""
    try:
        return dest_type(val)
    except ValueError:
        return default


def _check_train_perc(train_perc: float) -> None:
    if not 0.0 < train_perc < 1.0:
        raise ValueError(f"train_perc must be in range (0.0, 1.0), got {train_perc}")


class _IdxFilter(IterDataPipe):
    def __init__(self, datapipe: IterDataPipe, filter_fn: Callable[[int], bool]) -> None:
        super().__init__()
        self.datapipe, self.filter_fn = datapipe, filter_fn

    def __iter__(self) -> Iterator[Any]:
        return (data for index, data in enumerate(self.datapipe) if self.filter_fn(index))


def _default_key_fn(idx: int) -> int:
    return idx


def train_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int, idx: int) -> bool:
    """Whether sample ``idx`` is a training one: its key's last ``decimal_places`` digits fall in the
    first ``train_perc`` of their range."""
    scale = 10**decimal_places
    return key_fn(idx) % scale < round(train_perc * scale)


def val_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int, idx: int) -> bool:
    return not train_filter(key_fn, train_perc, decimal_places, idx)


def idx_split_train_val(
    datapipe: IterDataPipe,
    train_perc: float,
    decimal_places: int = 2,
    key_fn: Callable[[int], int] = _default_key_fn,
) -> tuple[IterDataPipe, IterDataPipe]:
    """Disjoint (train, validation) pipes over ``datapipe``, split by each sample's index (``key_fn``)."""
    _check_train_perc(train_perc)
    return (
        _IdxFilter(datapipe, partial(train_filter, key_fn, train_perc, decimal_places)),
        _IdxFilter(datapipe, partial(val_filter, key_fn, train_perc, decimal_places)),
    )


class _RandFilter(IterDataPipe):
    """Samples for which ``filter_fn(generator)`` holds; the generator restarts from its initial state on
    every iteration, so two filters over one seed split the same way every time."""

    def __init__(
        self, datapipe: IterDataPipe, filter_fn: Callable[[random.Random], bool], rand_gen: random.Random
    ):
        super().__init__()
        self.datapipe, self.filter_fn, self.rand_gen = datapipe, filter_fn, rand_gen
        self.rand_gen_init_state: tuple[Any, ...] = rand_gen.getstate()

    def __iter__(self) -> Iterator[Any]:
        self.rand_gen.setstate(self.rand_gen_init_state)
        return (data for data in self.datapipe if self.filter_fn(self.rand_gen))


def _in_train(train_perc: float, rand_gen: random.Random) -> bool:
    return rand_gen.random() < train_perc


def _in_val(train_perc: float, rand_gen: random.Random) -> bool:
    return not _in_train(train_perc, rand_gen)


def rand_split_train_val(
    datapipe: IterDataPipe, train_perc: float, random_seed: int = 0
) -> tuple[IterDataPipe, IterDataPipe]:
    """Disjoint (train, validation) pipes: each sample goes to train with probability ``train_perc``,
    drawn from ``random.Random(random_seed)`` (the same seed gives the same split)."""
    _check_train_perc(train_perc)
    return (
        _RandFilter(datapipe, partial(_in_train, train_perc), random.Random(random_seed)),
        _RandFilter(datapipe, partial(_in_val, train_perc), random.Random(random_seed)),
    )


@functional_datapipe("limit")
class Limit(IterDataPipe):
    """The first ``limit`` samples of ``datapipe`` (``datapipe.limit(n)``)."""

    def __init__(self, datapipe: IterDataPipe, limit: int) -> None:
        super().__init__()
        self.datapipe, self.limit = datapipe, limit

    def __iter__(self) -> Iterator[Any]:
        for index, data in enumerate(self.datapipe):
            if index >= self.limit:
                break
            yield data


class ReadLinesFromCSV(IterDataPipe):
    """The CSV rows of each ``(name, stream)`` of ``datapipe`` (``kw`` go to ``csv.reader``)."""

    def __init__(self, datapipe: IterDataPipe, skip_first_line: bool = False, **kw: Any) -> None:
        super().__init__()
        self.datapipe, self.skip_first_line, self.kw = datapipe, skip_first_line, kw

    def __iter__(self) -> Iterator[list[str]]:
        for _name, stream in self.datapipe:
            rows = csv.reader(stream, **self.kw)
            if self.skip_first_line:
                next(rows, None)
            yield from rows


class LoadFiles(IterDataPipe):
    """``(path, open stream)`` for each path of ``datapipe`` (local files; see ``npy_files``)."""

    def __init__(
        self,
        datapipe: Iterable[str],
        mode: str = "b",
        length: int = -1,
        path_manager_key: str = PATH_MANAGER_KEY,
        **open_kw: Any,
    ) -> None:
        super().__init__()
        if mode not in ("b", "t", "rb", "rt", "r"):
            raise ValueError(f"Invalid mode {mode}")
        self.datapipe, self.mode, self.length = datapipe, mode, length
        self.path_manager_key, self.open_kw = path_manager_key, open_kw

    def __iter__(self) -> Iterator[tuple[str, IO]]:
        mode = "r" + self.mode if self.mode in ("b", "t") else self.mode
        for path in self.datapipe:
            if not isinstance(path, str):
                raise TypeError(f"Expected string type for pathname, but got {type(path)}")
            yield path, open_file(path, mode, self.path_manager_key, **self.open_kw)

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError("LoadFiles was given no length")
        return self.length


def _default_dp_selector(datapipes: Sequence[IterDataPipe]) -> Sequence[IterDataPipe]:
    """This DataLoader worker's share of ``datapipes``: contiguous, as even as possible, earlier workers
    taking the larger shares."""
    worker = get_worker_info()
    if worker is None:
        return datapipes
    if worker.num_workers > len(datapipes):
        raise ValueError(
            f"Number of workers {worker.num_workers} exceeds number of datapipes ({len(datapipes)})!"
        )
    starts = [0]
    for workers_left in range(worker.num_workers, 0, -1):
        starts.append(starts[-1] + math.ceil((len(datapipes) - starts[-1]) / workers_left))
    return datapipes[starts[worker.id] : starts[worker.id + 1]]


class ParallelReadConcat(IterDataPipe):
    """The samples of ``datapipes`` one after another; in a DataLoader each worker reads its own share."""

    def __init__(
        self,
        *datapipes: IterDataPipe,
        dp_selector: Callable[[Sequence[IterDataPipe]], Sequence[IterDataPipe]] = _default_dp_selector,
    ) -> None:
        super().__init__()
        self.datapipes: tuple[IterDataPipe, ...] = datapipes
        self.dp_selector = dp_selector

    def __iter__(self) -> Iterator[Any]:
        for datapipe in self.dp_selector(self.datapipes):
            yield from datapipe
