"""A model trained with disk tables exports the same package as the same model trained in RAM: from its
checkpoint (streamed table by table) and from the module in memory (its mapped tables read in place)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from recserve.export import export_package, synthetic_sample
from recserve.export.exporter import export_checkpoint
from recserve.export.sources import CheckpointSource
from recserve.runtime import read_manifest
from rectrain.checkpoint import save_checkpoint
from rectrain.embedding import FusedOptimizerConfig, disk_tables
from rectrain.models import Batch, build_train_model
from tests.export.common import dlrm_config, request

# Row cache of the one disk kernel: about 55% of each table's rows (36 bytes a row with row-wise Adagrad).
CACHE = 14_000


def _trained(storage: str, root: Path):
    cfg = dlrm_config()
    cfg = dataclasses.replace(cfg, tables=[dataclasses.replace(t, storage=storage) for t in cfg.tables])
    torch.manual_seed(0)
    model = build_train_model(cfg, fused_optimizer=FusedOptimizerConfig())
    optimizer = torch.optim.Adagrad([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for step in range(3):
        dense, kjt = request(cfg, batch=8, seed=step)
        labels = torch.randint(0, 2, (8,), generator=torch.Generator().manual_seed(step))
        loss, _ = model(Batch(dense, kjt, labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_checkpoint(root, model=model, step=3, model_config=cfg)
    return cfg, model


@pytest.mark.slow  # four exports, each with its accuracy gate: about 25 s on a loaded 2-core machine
def test_disk_and_ram_tables_export_the_same_package(tmp_path: Path) -> None:
    before = disk_tables.settings()
    disk_tables.configure(disk_tables.DiskTablesSettings(dir=str(tmp_path / "tables"), cache_bytes=CACHE))
    try:
        packages: dict[str, list] = {}
        for storage in ("ram", "disk"):
            cfg, model = _trained(storage, tmp_path / f"ckpt_{storage}")
            sample = synthetic_sample(cfg, 128)
            from_checkpoint = export_checkpoint(
                tmp_path / f"pkg_ckpt_{storage}",
                cfg,
                CheckpointSource(tmp_path / f"ckpt_{storage}"),
                accuracy_sample=sample,
            )
            from_module = export_package(
                tmp_path / f"pkg_module_{storage}",
                model_config=cfg,
                model=model.model,
                accuracy_sample=sample,
            )
            packages[storage] = [read_manifest(from_checkpoint).files, read_manifest(from_module).files]
        assert any(tmp_path.joinpath("tables").rglob("*.weights"))  # the disk model's tables were mapped
        for ram_files, disk_files in zip(packages["ram"], packages["disk"]):
            assert ram_files == disk_files  # every file: same sha256 and size
    finally:
        disk_tables.configure(before)
