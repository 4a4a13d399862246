"""Disk tables (``storage = "disk"``): training through the hot-row cache is bitwise the training in RAM,
with the tables far larger than their forced-small cache, with and without prefetching the next batch;
files, cache bound and refusals."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection, disk_tables
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig, PoolingType
from rectrain.embedding.disk_tables import DiskTablesSettings
from rectrain.embedding.table_batch import FusedTableBatch
from rectrain.errors import ConfigError
from tests.embedding.reference import random_batch

CACHE_ROWS = 1000  # slots of "big" (8,192 rows); a batch reads about 560 of its rows
STEPS = 6
# Bytes of one row of "big" (16 floats) with its optimizer state, per optimizer.
ROW_BYTES = {"sgd": 64, "adagrad": 128, "rowwise_adagrad": 68, "adam": 192}
CACHE = CACHE_ROWS * ROW_BYTES["rowwise_adagrad"]


@pytest.fixture
def disk_dir(tmp_path: Path) -> Iterator[Path]:
    before = disk_tables.settings()
    disk_tables.configure(DiskTablesSettings(dir=str(tmp_path), cache_bytes=CACHE))
    yield tmp_path
    disk_tables.configure(before)


def _tables(storage: str) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name="big", num_embeddings=8192, embedding_dim=16, feature_names=["f0", "f1"], storage=storage
        ),
        EmbeddingBagConfig(
            name="odd", num_embeddings=4096, embedding_dim=6, pooling=PoolingType.MEAN, storage=storage
        ),
        EmbeddingBagConfig(name="small", num_embeddings=50, embedding_dim=8),  # stays in RAM
    ]


ROWS = {"f0": 8192, "f1": 8192, "odd": 4096, "small": 50}


def _batch(step: int):
    return random_batch(ROWS, 64, torch.Generator().manual_seed(step), max_len=8).kjt()


def _train(storage: str, optimizer: str, prefetch: bool = False) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    config = FusedOptimizerConfig(optimizer=optimizer, lr=0.05)
    ebc = EmbeddingBagCollection(_tables(storage), fused_optimizer=config)
    for step in range(STEPS):
        if prefetch and step == 0:
            ebc.prefetch(_batch(0))
        out = ebc(_batch(step)).values()
        if prefetch and step + 1 < STEPS:
            ebc.prefetch(_batch(step + 1))  # as the pipeline does: after forward, while backward runs
        target = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + step))
        ((out - target) ** 2).sum().backward()
    return ebc


def _disk_buffers(ebc: EmbeddingBagCollection) -> list[disk_tables.DiskBuffers]:
    return [b.disk for b in ebc.embedding_bags.batches if b.disk is not None]


def _caches(ebc: EmbeddingBagCollection) -> list:
    return [b.cache for b in ebc.embedding_bags.batches if b.cache is not None]


@pytest.mark.parametrize("prefetch", [False, True], ids=["sync", "prefetch"])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_disk_training_is_bitwise_ram_training(disk_dir: Path, optimizer: str, prefetch: bool) -> None:
    disk_tables.configure(
        DiskTablesSettings(dir=str(disk_dir), cache_bytes=CACHE_ROWS * ROW_BYTES[optimizer])
    )
    ram = _train("ram", optimizer)
    disk = _train("disk", optimizer, prefetch)
    buffers = _disk_buffers(disk)
    assert len(buffers) == 2 and not _disk_buffers(ram)  # SUM and MEAN kernels; "small" stays in RAM
    big = _caches(disk)[0].tables[0]
    assert (big.name, big.slots, big.rows) == ("big", CACHE_ROWS, 8192), "the cache is far smaller"
    assert disk.embedding_bags.batches[0].tbe.weights_host.numel() == CACHE_ROWS * 16  # only slots in RAM
    caches = _caches(disk)
    # Rows were evicted (read more rows than there are slots) and updated ones written back.
    assert caches[0].misses > CACHE_ROWS and caches[0].writes > 0
    for name, value in ram.state_dict().items():
        assert torch.equal(disk.state_dict()[name], value), name
    ram_state = ram.fused_optimizer.state_dict()["state"]
    disk_state = disk.fused_optimizer.state_dict()["state"]
    assert ram_state.keys() == disk_state.keys()
    for key, states in ram_state.items():
        for name, value in states.items():
            assert torch.equal(disk_state[key][name], value), f"{key} {name}"


def test_rows_live_in_the_files(disk_dir: Path) -> None:
    ebc = _train("disk", "rowwise_adagrad")
    buffers = _disk_buffers(ebc)[0]  # the SUM kernel: "big"
    ebc.embedding_bags.flush()  # the cache's updated rows go back: the files then hold the whole tables
    files = {p.name.rsplit(".", 1)[1]: p for p in buffers.paths}
    assert set(files) == {"weights", "momentum1"}
    assert all(p.parent.parent == disk_dir for p in files.values())
    # What the file holds is what the model reads.
    on_disk = np.fromfile(files["weights"], dtype=np.float32)
    assert np.array_equal(on_disk, ebc.embedding_bags["big"].weight.flatten().numpy())
    momentum = np.fromfile(files["momentum1"], dtype=np.float32)
    state = ebc.fused_optimizer.state_dict()["state"]["embedding_bags.big.weight"]["big.momentum1"]
    assert np.array_equal(momentum[:8192], state.numpy())
    (odd,) = [b for b in _disk_buffers(ebc) if b is not buffers]
    odd_rows = np.fromfile(odd.paths[0], dtype=np.float32).reshape(4096, 8)[:, :6]  # kernel width 8, padded
    assert torch.equal(torch.from_numpy(odd_rows), ebc.embedding_bags["odd"].weight)
    paths = [*buffers.paths, *odd.paths]
    del odd
    del ebc, buffers
    gc.collect()
    assert not any(p.exists() for p in paths), "a released kernel's files are removed"


def test_writes_into_the_tables_are_read_by_the_next_batch(disk_dir: Path) -> None:
    """``load_state_dict`` (and anything that writes the weight parameters) goes to the files; the cache is
    emptied first, so the next lookup reads the new rows, not stale slots."""
    ebc = _train("disk", "sgd")
    ram = _train("ram", "sgd")
    state = {k: torch.randn_like(v) for k, v in ram.state_dict().items()}
    ebc.load_state_dict(state)
    ram.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(ebc(_batch(99)).values(), ram(_batch(99)).values())


def test_a_batch_larger_than_the_cache_is_refused_by_name(disk_dir: Path) -> None:
    disk_tables.configure(DiskTablesSettings(dir=str(disk_dir), cache_bytes=100 * ROW_BYTES["sgd"]))
    ebc = EmbeddingBagCollection(_tables("disk"), fused_optimizer=FusedOptimizerConfig(optimizer="sgd"))
    with pytest.raises(
        ConfigError, match=r"table 'big': a batch reads \d+ distinct rows but its disk cache has 100"
    ):
        ebc(_batch(0))


def test_sequence_tables_on_disk_match_ram(disk_dir: Path) -> None:
    def train(storage: str) -> EmbeddingCollection:
        torch.manual_seed(1)
        tables = [EmbeddingConfig(name="seq", num_embeddings=4096, embedding_dim=8, storage=storage)]
        ec = EmbeddingCollection(tables, fused_optimizer=FusedOptimizerConfig(optimizer="adagrad", lr=0.1))
        for step in range(3):
            batch = random_batch({"seq": 4096}, 32, torch.Generator().manual_seed(step))
            out = ec(batch.kjt())["seq"].values()
            (out**2).sum().backward()
        return ec

    ram, disk = train("ram"), train("disk")
    disk.embeddings.flush()  # the weight parameters show the files: the cache writes its rows back first
    assert torch.equal(ram.embeddings["seq"].weight, disk.embeddings["seq"].weight)


def test_storage_refusals(disk_dir: Path) -> None:
    with pytest.raises(ConfigError, match="table 't': storage must be one of ram, disk; got 'ssd'"):
        EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4, storage="ssd")
    table = EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4, storage="disk")
    # Refused before any CUDA call: the check runs before the kernel is built.
    with pytest.raises(ConfigError, match=r"tables \['t'\]: storage 'disk' runs on CPU only"):
        FusedTableBatch([table], PoolingMode.SUM, FusedOptimizerConfig(), torch.device("cuda"))


def test_a_collection_without_a_fused_optimizer_says_its_disk_tables_stay_in_ram(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="rectrain.embedding.dense_tables"):
        ebc = EmbeddingBagCollection(_tables("disk"))
        ec = EmbeddingCollection(
            [
                EmbeddingConfig(
                    name="s", embedding_dim=8, num_embeddings=50, feature_names=["q"], storage="disk"
                )
            ]
        )
    assert ebc.embedding_bags[_tables("disk")[0].name].weight.device.type == "cpu"
    assert ec.embeddings["s"].weight.shape == (50, 8)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("storage 'disk'" in m and "fused_optimizer=" in m for m in messages)
