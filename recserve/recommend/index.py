"""The approximate nearest-neighbour index over the item embeddings (faiss, inner product).

Chosen by catalogue size: exact search (``IndexFlatIP``) up to ``FLAT_MAX_ITEMS`` items, else an inverted
file (``IndexIVFFlat``, ``nlist`` about 2 sqrt(items), k-means on a sample: ``ivf_shape``) whose ``nprobe`` is
the smallest that reaches the target recall against exact search on sampled queries.

The inverted file searches by L2 distance over the embeddings with one column appended,
``x' = [x, sqrt(R^2 - |x|^2)]`` (``R`` the largest norm), the query's own column 0: then
``|q' - x'|^2 = |q|^2 + R^2 - 2 q.x``, so the nearest items are exactly those of the largest inner product
(manifest ``params.mips_to_l2``). Lists built this way group items by direction *and* norm, which inner
product lists do not: at 100k generated items (1,000 lists), 0.95 recall@100 takes 32 lists probed, not 64.

The index file is faiss's own serialisation (``write_index``; no pickle), verified by sha256 before it is
read, and read with ``IO_FLAG_MMAP_IFC`` so that its vectors stay in the page cache, one copy for every
worker.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from recserve.errors import ExportError, PackageError

logger = logging.getLogger(__name__)

FLAT_MAX_ITEMS = 50_000
INDEX_TYPES = ("auto", "flat", "ivf")
_ADD_ROWS = 65_536  # embeddings added to the index (or searched exactly) at once
TRAIN_PER_LIST = 40  # k-means sample per list (faiss asks for 39 to 256; k-means costs sample x nlist)
LISTS_PER_SQRT = 2  # lists per sqrt(items): more, shorter lists scan fewer vectors per query at one recall
KMEANS_ITERATIONS = 10  # faiss's default is 25; the lists only need to be coarse (nprobe is measured)


def _faiss():
    import faiss

    return faiss


@dataclass
class IndexChoice:
    """What was built and how well it does: recorded as the pipeline manifest's ``index``."""

    type: str
    params: dict[str, Any]
    recall: float
    recall_at: int
    recall_queries: int
    build_seconds: float
    build_cpu_seconds: float = 0.0  # this process's CPU time: beside the wall time on a loaded machine

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "metric": "inner_product",
            "params": self.params,
            "recall": {"at": self.recall_at, "queries": self.recall_queries, "value": self.recall},
            "build_seconds": self.build_seconds,
            "build_cpu_seconds": self.build_cpu_seconds,
        }


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |found ∩ exact| / |exact| (rows of item positions; -1 marks no item)."""
    hits = total = 0
    for f, e in zip(found, exact):
        e = e[e >= 0]
        hits += len(np.intersect1d(f[f >= 0], e))
        total += len(e)
    return hits / total if total else 1.0


def _augmented(block: Tensor, radius2: float | None) -> np.ndarray:
    """``block`` as float32 rows for the index: as they are, or with the column ``sqrt(radius2 - |x|^2)``."""
    rows = block.float()
    if radius2 is not None:
        extra = (radius2 - rows.square().sum(1, keepdim=True)).clamp_min(0).sqrt()
        rows = torch.cat([rows, extra], dim=1)
    return np.ascontiguousarray(rows.numpy(), dtype=np.float32)


def _add(index, embeddings: Tensor, radius2: float | None = None) -> None:
    for start in range(0, embeddings.shape[0], _ADD_ROWS):
        index.add(_augmented(embeddings[start : start + _ADD_ROWS], radius2))


def _largest_norm2(embeddings: Tensor) -> float:
    return max(
        float(embeddings[s : s + _ADD_ROWS].float().square().sum(1).max())
        for s in range(0, embeddings.shape[0], _ADD_ROWS)
    )


def exact_search(embeddings: Tensor, queries: Tensor, k: int) -> Tensor:
    """Positions ``[Q, k]`` of the best ``k`` items per query by brute force, a block of rows at a time (a
    mapped tensor is read once, never copied whole)."""
    best_scores = torch.full((queries.shape[0], 0), float("-inf"))
    best = torch.zeros((queries.shape[0], 0), dtype=torch.int64)
    q = queries.float()
    for start in range(0, embeddings.shape[0], _ADD_ROWS):
        scores = q @ embeddings[start : start + _ADD_ROWS].float().T
        top = torch.topk(scores, min(k, scores.shape[1]), dim=1)
        merged = torch.cat([best_scores, top.values], dim=1)
        rows = torch.cat([best, top.indices + start], dim=1)
        keep = torch.topk(merged, min(k, merged.shape[1]), dim=1).indices
        best_scores, best = merged.gather(1, keep), rows.gather(1, keep)
    return best


def ivf_shape(items: int) -> tuple[int, int]:
    """``(nlist, train_rows)`` of the inverted file over ``items`` vectors.

    About 2 sqrt(items) lists (2,000 at 1M items: ~500 vectors scanned per probe), and k-means on a sample of
    ``TRAIN_PER_LIST`` vectors per list, not on every item. The build's cost is k-means (sample x nlist per
    iteration) and assigning every item to its list (items x nlist); the search's is the vectors scanned,
    which at one recall falls as the lists get shorter (at 100k generated items, 0.95 recall@100 by inner
    product scanned 6.4% of the items with 1,000 lists, 20% with 316)."""
    nlist = max(1, min(items // TRAIN_PER_LIST, int(LISTS_PER_SQRT * math.sqrt(items))))
    return nlist, min(items, TRAIN_PER_LIST * nlist)


def build_index(
    embeddings: Tensor,
    queries: Tensor,
    *,
    kind: str = "auto",
    recall_at: int = 100,
    target_recall: float = 0.96,
    seed: int = 0,
):
    """``(faiss index, IndexChoice)`` over ``embeddings [M, L]`` (a mapped tensor is read a block at a time);
    ``queries [Q, L]`` measure its recall@``recall_at`` against exact search."""
    faiss = _faiss()
    if kind not in INDEX_TYPES:
        raise ExportError(f"index: expected one of {list(INDEX_TYPES)}, got {kind!r}")
    started, cpu = time.perf_counter(), time.process_time()
    items, dim = embeddings.shape
    k = min(recall_at, items)
    q = np.ascontiguousarray(queries.numpy(), dtype=np.float32)
    if kind == "flat" or (kind == "auto" and items <= FLAT_MAX_ITEMS):
        exact = faiss.IndexFlatIP(dim)
        _add(exact, embeddings)
        elapsed = time.perf_counter() - started
        return exact, IndexChoice("flat", {}, 1.0, k, len(q), elapsed, time.process_time() - cpu)
    nlist, train_rows = ivf_shape(items)
    picked = np.sort(np.random.default_rng(seed).choice(items, train_rows, replace=False))
    radius2 = _largest_norm2(embeddings)
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim + 1), dim + 1, nlist, faiss.METRIC_L2)
    index.cp.seed = seed
    index.cp.niter = KMEANS_ITERATIONS
    index.train(_augmented(embeddings[torch.from_numpy(picked)], radius2))
    trained = time.perf_counter()
    _add(index, embeddings, radius2)
    added = time.perf_counter()
    truth = exact_search(embeddings, queries, k).numpy()
    searched = time.perf_counter()
    nprobe, measured = _smallest_nprobe(index, _query_rows(index, queries), truth, k, nlist, target_recall)
    elapsed = time.perf_counter() - started
    params = {
        "nlist": nlist,
        "nprobe": nprobe,
        "train_rows": train_rows,
        "kmeans_iterations": KMEANS_ITERATIONS,
        "mips_to_l2": True,
    }
    logger.info(
        "IVF build s: train %.1f, add %.1f, exact search %.1f, nprobe search %.1f",
        trained - started,
        added - trained,
        searched - added,
        time.perf_counter() - searched,
    )
    logger.info("IVF index over %d items: %s, recall@%d %.4f, %.1f s", items, params, k, measured, elapsed)
    return index, IndexChoice("ivf", params, measured, k, len(q), elapsed, time.process_time() - cpu)


def _smallest_nprobe(index, queries: np.ndarray, truth: np.ndarray, k: int, nlist: int, target: float):
    """``(nprobe, recall)``: the fewest lists probed whose recall reaches ``target`` (all lists if none
    does): doubling from 1, then bisecting between the last two tries. Each probe costs every query a
    scan of its vectors, so a tight nprobe is the serving's retrieval cost."""

    def measure(nprobe: int) -> float:
        index.nprobe = nprobe
        return recall(index.search(queries, k)[1], truth)

    low, high, reached = 0, 1, measure(1)  # low: a count known to miss the target (0: none tried)
    while reached < target and high < nlist:
        low, high = high, min(nlist, high * 2)
        reached = measure(high)
    while high - low > 1 and reached >= target:
        middle = (low + high) // 2
        got = measure(middle)
        if got >= target:
            high, reached = middle, got
        else:
            low = middle
    index.nprobe = high
    return high, reached


def set_search_threads(threads: int) -> None:
    """The OpenMP threads faiss searches with, in this process."""
    _faiss().omp_set_num_threads(max(1, int(threads)))


def write_index(index, path: Path) -> None:
    _faiss().write_index(index, str(path))


def read_index(path: Path, entry: dict[str, Any]):
    """The index at ``path`` (already verified by sha256), mapped read-only, with its search parameters."""
    faiss = _faiss()
    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError as error:
        raise PackageError(f"{path}: not a faiss index ({str(error).splitlines()[0][:200]})") from None
    kind = entry.get("type")
    if kind == "ivf":
        if not isinstance(index, faiss.IndexIVF):
            raise PackageError(f"{path}: manifest index.type 'ivf', the file holds {type(index).__name__}")
        index.nprobe = int(entry["params"]["nprobe"])
        if bool(entry["params"].get("mips_to_l2")) != (index.metric_type == faiss.METRIC_L2):
            raise PackageError(f"{path}: manifest index.params.mips_to_l2 does not fit the file's metric")
    elif kind != "flat" or not isinstance(index, faiss.IndexFlat):
        raise PackageError(
            f"{path}: manifest index.type {kind!r} does not fit the file's {type(index).__name__}"
        )
    return index


def search(index, queries: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(distances [B, n] float32, positions [B, n] int64)``, best first; a position of -1 marks no item.

    An index over augmented embeddings (one more column than the queries: ``mips_to_l2``) is searched with
    the queries' extra column 0; its distances are then L2 ones, not inner products."""
    distances, positions = index.search(_query_rows(index, queries), n)
    return torch.from_numpy(distances), torch.from_numpy(positions)


def _query_rows(index, queries: Tensor) -> np.ndarray:
    """``queries`` as float32 rows for ``index``: with a column 0 appended where the index is over augmented
    embeddings (one more column than the queries)."""
    q = queries.float()
    if index.d == q.shape[1] + 1:
        q = torch.cat([q, q.new_zeros(q.shape[0], 1)], dim=1)
    return np.ascontiguousarray(q.numpy(), dtype=np.float32)
