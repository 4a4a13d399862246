"""TorchRec's Criteo .npy tools run from ``torchrec`` or ``rectrain`` on the same files.

``python criteo_parity_job.py <torchrec|rectrain> <dir>``: the first run writes day files to ``<dir>`` (three
.npy days and a TSV with empty fields and negative integers); each run writes what the tools made of them:
in-memory batches for several stages, ranks, shuffles and hashes, tsv_to_npys, sparse_to_contiguous, shuffle.
"""

from __future__ import annotations

import importlib
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROWS = [37, 51, 20]
SETTINGS = [
    dict(stage="train", batch_size=8, rank=1, world_size=3),
    dict(stage="val", batch_size=5, rank=0, world_size=2, hashes=list(range(100, 126))),
    dict(stage="test", batch_size=4, rank=1, world_size=2),
    dict(
        stage="train",
        batch_size=7,
        rank=2,
        world_size=4,
        shuffle_training_set=True,
        shuffle_training_set_random_seed=3,
    ),
    dict(stage="train", batch_size=6, rank=0, world_size=2, shuffle_batches=True, drop_last=True),
]


def _tensor(path: Path) -> torch.Tensor:
    """A written .npy file as a tensor (same dtype), so the results load with torch's weights-only loader."""
    return torch.from_numpy(np.load(path))


def _write_days(folder: Path) -> None:
    rng = np.random.default_rng(0)
    for day, rows in enumerate(ROWS):
        np.save(folder / f"day_{day}_dense.npy", rng.random((rows, 13)).astype(np.float32))
        np.save(folder / f"day_{day}_sparse.npy", rng.integers(0, 10**6, (rows, 26)).astype(np.int32))
        np.save(folder / f"day_{day}_labels.npy", rng.integers(0, 2, (rows, 1)).astype(np.int32))
    chance = random.Random(0)
    with open(folder / "day_x.tsv", "w") as out:
        for _ in range(30):
            ints = [str(chance.randint(-3, 50)) if chance.random() > 0.2 else "" for _ in range(13)]
            cats = [f"{chance.getrandbits(32):08x}" if chance.random() > 0.2 else "" for _ in range(26)]
            out.write("\t".join([str(chance.randint(0, 1)), *ints, *cats]) + "\n")


def main(package: str, folder: Path) -> None:
    if not (folder / "day_x.tsv").exists():
        _write_days(folder)
    criteo = importlib.import_module(f"{package}.datasets.criteo")
    paths = [
        [str(folder / f"day_{d}_{kind}.npy") for d in range(3)] for kind in ("dense", "sparse", "labels")
    ]
    results = {}
    for number, kwargs in enumerate(SETTINGS):
        data = criteo.InMemoryBinaryCriteoIterDataPipe(
            dense_paths=paths[0], sparse_paths=paths[1], labels_paths=paths[2], **kwargs
        )
        batches = [(b.dense_features, b.sparse_features.values(), b.labels) for b in data]
        results[f"batches{number}"] = (batches, len(data))
    out = Path(tempfile.mkdtemp())
    tools = criteo.BinaryCriteoUtils
    tools.tsv_to_npys(str(folder / "day_x.tsv"), str(out / "a.npy"), str(out / "b.npy"), str(out / "c.npy"))
    results["tsv_to_npys"] = [_tensor(out / f"{name}.npy") for name in "abc"]
    tools.sparse_to_contiguous(paths[1], str(out), 2)
    results["contiguous"] = [_tensor(out / f"day_{d}_sparse_contig_freq.npy") for d in range(3)]
    tools.shuffle(
        str(folder), str(folder), str(out), {0: ROWS[0], 1: ROWS[1]}, None, 3, 13, 26, random_seed=5
    )
    results["shuffle"] = [
        _tensor(out / f"day_{d}_{k}.npy") for d in range(3) for k in ("dense", "sparse", "labels")
    ]
    torch.save(results, folder / f"{package}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
