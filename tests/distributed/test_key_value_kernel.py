"""TorchRec's ``EmbeddingComputeKernel.KEY_VALUE``: accepted in a plan as the fused kernel over a disk table,
refused by name where rectrain cannot honour it (data-parallel, not on CPU)."""

from __future__ import annotations

import pytest
import torch

from rectrain.distributed.sharded.weights import key_value_on_disk
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.errors import ConfigError
from rectrain.planner.types import EmbeddingComputeKernel, ParameterSharding, ShardingType


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="big", num_embeddings=1000, embedding_dim=8),
        EmbeddingBagConfig(name="small", num_embeddings=10, embedding_dim=8),
    ]


def test_key_value_in_a_plan_puts_the_table_on_disk() -> None:
    plan = {
        "big": ParameterSharding(ShardingType.TABLE_WISE, "key_value", [0]),
        "small": ParameterSharding(ShardingType.TABLE_WISE, "fused", [0]),
    }
    assert plan["big"].compute_kernel is EmbeddingComputeKernel.KEY_VALUE
    tables = key_value_on_disk(_tables(), plan, torch.device("cpu"))
    assert [t.storage for t in tables] == ["disk", "ram"]
    assert [t.storage for t in _tables()] == ["ram", "ram"]  # the collection's own configs are untouched


@pytest.mark.parametrize(
    ("sharding_type", "device", "named"),
    [
        (ShardingType.DATA_PARALLEL, "cpu", "data_parallel on cpu"),
        (ShardingType.TABLE_WISE, "meta", "on meta"),
    ],
)
def test_key_value_is_refused_by_name_where_it_cannot_run(
    sharding_type: ShardingType, device: str, named: str
) -> None:
    plan = {
        "big": ParameterSharding(sharding_type, "key_value", [0]),
        "small": ParameterSharding(ShardingType.TABLE_WISE, "fused", [0]),
    }
    with pytest.raises(ConfigError, match=f"table 'big': compute kernel 'key_value' .*{named}"):
        key_value_on_disk(_tables(), plan, torch.device(device))


def test_other_kernels_torchrec_names_stay_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="compute kernel 'ssd_virtual_table' .* 'key_value' \\(disk tables"):
        ParameterSharding(ShardingType.TABLE_WISE, "ssd_virtual_table", [0])
