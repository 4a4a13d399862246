"""TorchRec's enumerator API (``rectrain.distributed.planner.enumerators``) on small models."""

from __future__ import annotations

import pytest
import torch

from rectrain.distributed.embedding_tower_sharding import EmbeddingTowerSharder
from rectrain.distributed.parallel.model_parallel import refuse_unsupported_sharders
from rectrain.distributed.parallel.sharders import EmbeddingBagCollectionSharder
from rectrain.distributed.planner.enumerators import EmbeddingEnumerator
from rectrain.distributed.planner.types import ParameterConstraints, Storage, Topology
from rectrain.distributed.test_utils.test_model import TestTowerSparseNN
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.errors import ConfigError
from rectrain.planner import EmbeddingShardingPlanner
from rectrain.planner.enumerate import row_blocks
from rectrain.planner.types import ParameterSharding

WORLD, BATCH = 4, 32


def _tables(n: int = 2, **kwargs) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            num_embeddings=100 + 10 * i, embedding_dim=16, name=f"t{i}", feature_names=[f"f{i}"], **kwargs
        )
        for i in range(n)
    ]


def _ebc(**kwargs) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(_tables(**kwargs), device=torch.device("meta"))


def _enumerator(device: str = "cpu", constraints=None) -> EmbeddingEnumerator:
    topology = Topology(
        world_size=WORLD, compute_device=device, local_world_size=2, ddr_cap=2**34, hbm_cap=2**34
    )
    return EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=constraints)


def test_rectrains_sharders_offer_only_what_it_runs():
    options = _enumerator().enumerate(_ebc(), [EmbeddingBagCollectionSharder()])
    kinds = {(o.name, o.sharding_type, o.compute_kernel) for o in options}
    expected = {"data_parallel": "dense", "table_wise": "fused", "row_wise": "fused", "column_wise": "fused"}
    expected["table_row_wise"] = "fused"
    assert kinds == {(t, s, k) for t in ("t0", "t1") for s, k in expected.items()}


def test_table_wise_storage_is_the_documented_formula_in_host_memory_on_cpu():
    options = _enumerator().enumerate(_ebc(), [EmbeddingBagCollectionSharder()])
    option = next(o for o in options if o.name == "t1" and o.sharding_type == "table_wise")
    ids = BATCH * WORLD * 8  # one id per example from every rank, int64
    outputs = BATCH * WORLD * 16 * 4  # one pooled fp32 row per example of every rank
    assert option.shards[0].storage == Storage(hbm=0, ddr=110 * 16 * 4 + ids + outputs)


def test_cuda_plans_count_hbm_and_optimizer_state():
    ebc = _ebc()
    ebc.embedding_bags["t0"].weight._optimizer_classes = [torch.optim.Adam]  # two moments per weight
    options = _enumerator("cuda").enumerate(ebc, [EmbeddingBagCollectionSharder()])
    option = next(o for o in options if o.name == "t0" and o.sharding_type == "table_wise")
    weights = 100 * 16 * 4
    assert option.shards[0].storage == Storage(hbm=3 * weights + BATCH * WORLD * (8 + 64), ddr=0)


def test_row_wise_shards_are_the_blocks_rectrains_plans_use():
    options = _enumerator().enumerate(_ebc(), [EmbeddingBagCollectionSharder()])
    option = next(o for o in options if o.name == "t1" and o.sharding_type == "row_wise")
    assert [(s.offset[0], s.size[0]) for s in option.shards] == row_blocks(110, WORLD)
    twrw = next(o for o in options if o.name == "t1" and o.sharding_type == "table_row_wise")
    assert [s.size for s in twrw.shards] == [[55, 16], [55, 16]]  # over the 2 ranks of a host


def test_virtual_table_row_wise_shards_are_whole_buckets():
    constraints = {t: ParameterConstraints(compute_kernels=["dram_virtual_table"]) for t in ("t0", "t1")}

    class Sharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type):
            return ["row_wise"]

        def compute_kernels(self, sharding_type, compute_device_type):
            return ["dram_virtual_table"]

    ebc = EmbeddingBagCollection(
        _tables(total_num_buckets=5, use_virtual_table=True), device=torch.device("meta")
    )
    options = _enumerator(constraints=constraints).enumerate(ebc, [Sharder()])
    # 100 rows in 5 buckets of 20 over 4 ranks: the first rank takes the extra bucket.
    assert [s.size[0] for s in options[0].shards] == [40, 20, 20, 20]
    with pytest.raises(ConfigError, match="dram_virtual_table"):
        ParameterSharding("row_wise", options[0].compute_kernel)


def test_a_table_without_options_is_named():
    constraints = {"t1": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["dense"])}
    with pytest.raises(ConfigError, match="table 't1'.*EmbeddingBagCollectionSharder"):
        _enumerator(constraints=constraints).enumerate(_ebc(), [EmbeddingBagCollectionSharder()])


def test_towers_are_planned_with_their_dependency_but_not_sharded():
    tables = [EmbeddingBagConfig(num_embeddings=20, embedding_dim=8, name=f"t{i}") for i in range(4)]
    weighted = [EmbeddingBagConfig(num_embeddings=20, embedding_dim=8, name="w0")]
    model = TestTowerSparseNN(tables=tables, weighted_tables=weighted)
    options = _enumerator().enumerate(model, [EmbeddingTowerSharder(), EmbeddingBagCollectionSharder()])
    dependencies = {o.name: o.dependency for o in options}
    assert dependencies == {"t0": "tower_1", "t1": None, "t2": "tower_0", "t3": "tower_0", "w0": None}
    with pytest.raises(ConfigError, match="does not shard embedding towers"):
        refuse_unsupported_sharders([EmbeddingTowerSharder()])


def test_torchrec_only_sharding_types_are_never_planned_or_run():
    with pytest.raises(ConfigError, match="table_column_wise"):
        ParameterSharding("table_column_wise", "fused")
    constraints = {"t0": ParameterConstraints(sharding_types=["table_column_wise"])}
    planner = EmbeddingShardingPlanner(
        Topology(world_size=2, ddr_cap=2**34), batch_size=8, constraints=constraints
    )
    with pytest.raises(ConfigError, match="table_column_wise.*TorchRec's"):
        planner.plan({"": _tables()})


def test_rectrains_planner_refuses_virtual_tables():
    planner = EmbeddingShardingPlanner(Topology(world_size=2, ddr_cap=2**34), batch_size=8)
    with pytest.raises(ConfigError, match="use_virtual_table"):
        planner.plan({"": _tables(total_num_buckets=10, use_virtual_table=True)})
