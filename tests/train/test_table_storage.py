"""A run's table storage: ``storage = "disk"`` in the config trains on disk files under
``train.disk_tables_dir``; ``planner.memory_plan`` moves what does not fit to disk, or refuses with
numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rectrain.distributed.parallel.model_parallel import find_collections
from rectrain.embedding import disk_tables
from rectrain.errors import ConfigError
from rectrain.train.build import build_training
from rectrain.train.config import RunConfig

MODEL = """
[model]
kind = "dlrm"
dense_in_features = 4
dense_arch_layer_sizes = [8]
over_arch_layer_sizes = [1]
tables = [
  { name = "small", num_embeddings = 100, embedding_dim = 8 },
  { name = "big", num_embeddings = 200000, embedding_dim = 8 %s },
]
"""


@pytest.fixture(autouse=True)
def _restore_settings():
    before = disk_tables.settings()
    yield
    disk_tables.configure(before)


def _config(tmp_path: Path, big: str = "", extra: str = "") -> RunConfig:
    path = tmp_path / "run.toml"
    path.write_text(MODEL % big + f'[train]\ndisk_tables_dir = "{tmp_path / "tables"}"\nsteps = 1\n' + extra)
    return RunConfig.load(path)


def _storage(training) -> dict[str, str]:
    (ebc,) = find_collections(training.model).values()
    return {t.name: t.storage for t in ebc.embedding_bag_configs()}


def test_configured_disk_table_trains_from_the_disk_tables_dir(tmp_path: Path) -> None:
    training = build_training(_config(tmp_path, big=', storage = "disk"'), None)
    assert _storage(training) == {"small": "ram", "big": "disk"}
    assert len(list((tmp_path / "tables").rglob("big-*.weights"))) == 1


def test_memory_plan_moves_what_does_not_fit_to_disk(tmp_path: Path) -> None:
    # big: 200,000 x (8 + 1) floats = 7.2 MB; a 5 MB budget with no fixed part keeps only small in RAM.
    plan = "[planner]\nmemory_plan = true\nmemory_budget_gb = 0.005\nfixed_memory_gb = 0\n"
    training = build_training(_config(tmp_path, extra=plan), None)
    assert _storage(training) == {"small": "ram", "big": "disk"}
    # big's row cache is the memory the plan left it: about 5 MB less small, at 36 bytes a row.
    planned = disk_tables.settings().table_cache_bytes["big"]
    (ebc,) = find_collections(training.model).values()
    (cache,) = [b.cache for b in ebc.embedding_bags.batches if b.cache is not None]
    assert 0 < planned < 5_000_000 and cache.tables[0].slots == planned // 36 < 200_000


def test_memory_plan_refuses_a_model_that_cannot_fit(tmp_path: Path) -> None:
    plan = "[planner]\nmemory_plan = true\nmemory_budget_gb = 0.5\nfixed_memory_gb = 1\n"
    with pytest.raises(ConfigError, match=r"a rank needs 1\.00 GB .* budget is 0\.50 GB \(given / 1 ranks\)"):
        build_training(_config(tmp_path, extra=plan), None)


def test_a_bad_storage_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"run\.toml: model\.tables\[1\]: table 'big': storage must be one of"
    ):
        _config(tmp_path, big=', storage = "ssd"')
