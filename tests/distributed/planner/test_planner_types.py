"""TorchRec's planner records at its paths are the engine's own: one ``Shard``, one ``ShardingOption``."""

from unittest.mock import MagicMock

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode as FbgemmBoundsCheckMode
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm as FbgemmCacheAlgorithm

import rectrain.distributed.planner.types as torchrec_types
import rectrain.planner.sharding_option as engine_options
import rectrain.planner.types as engine_types
from rectrain.distributed.logger import static_logger
from rectrain.distributed.planner.perf_models import NoopPerfModel, NoopStorageModel
from rectrain.distributed.planner.shard_estimators import EmbeddingStorageEstimator
from rectrain.distributed.types import BoundsCheckMode, CacheAlgorithm
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.embedding.embedding_collection import EmbeddingCollection
from rectrain.planner.enumerate import EmbeddingEnumerator
from rectrain.planner.topology import Storage, Topology
from rectrain.planner.types import Shard


def test_one_shard_and_one_sharding_option():
    assert torchrec_types.Shard is engine_types.Shard
    assert torchrec_types.ShardingOption is engine_options.ShardingOption
    assert torchrec_types.Perf is engine_options.Perf
    assert BoundsCheckMode is FbgemmBoundsCheckMode
    assert CacheAlgorithm is FbgemmCacheAlgorithm


def test_torchrecs_distributed_loggers_are_standard_loggers(caplog):
    with caplog.at_level("INFO", logger="rectrain.distributed"):
        static_logger.info("planner: %d tables", 3)
    assert caplog.records[-1].getMessage() == "planner: 3 tables"


def test_shard_takes_torchrec_size_and_offset():
    shard = Shard(size=[10, 4], offset=[20, 8], rank=1)
    assert shard == Shard(20, 10, 8, 4, rank=1)
    assert hash(shard) == hash(Shard(20, 10, 8, 4, rank=1))
    assert (shard.size, shard.offset) == ([10, 4], [20, 8])
    assert (shard.shard_sizes, shard.shard_offsets) == ([10, 4], [20, 8])
    shard.storage = Storage(hbm=1, ddr=2)  # TorchRec's estimators fill shards in place
    assert shard == Shard(20, 10, 8, 4, rank=1)


def _option(module, dim: int = 160) -> engine_options.ShardingOption:
    return engine_options.ShardingOption(
        name="table_0",
        tensor=torch.empty((10_000, dim), dtype=torch.float16, device="meta"),
        module=("m", module),
        input_lengths=MagicMock(),
        batch_size=MagicMock(),
        sharding_type="column_wise",
        partition_by=MagicMock(),
        compute_kernel="fused",
        shards=[Shard(size=[10_000, 80], offset=[0, o]) for o in (0, 80)],
        bounds_check_mode=BoundsCheckMode.WARNING,
    )


def test_sharding_option_keeps_torchrec_constructor_and_pooling():
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(10_000, 160, name="table_0", feature_names=["f"])])
    ec = EmbeddingCollection([EmbeddingConfig(10_000, 80, name="table_0", feature_names=["f"])])
    assert _option(ebc).is_pooled and not _option(ec, 80).is_pooled
    assert hash(_option(ebc))
    assert _option(ebc).fqn == "m.table_0"


def test_options_from_table_configs_carry_the_table_and_features():
    table = EmbeddingConfig(100, 8, name="t")
    option = engine_options.ShardingOption.for_table(
        "ec", table, "table_wise", "fused", [Shard(0, 100, 0, 8)], [(16, 2.0), (32, 1.0)]
    )
    assert (option.table, option.path, option.name, option.is_pooled) == (table, "ec", "t", False)
    assert option.features == [(16, 2.0), (32, 1.0)]
    assert option.partition_by == "device" and tuple(option.tensor.shape) == (100, 8)
    placed = option.with_shards([Shard(0, 100, 0, 8, rank=1)])
    assert placed.get_shards_assignment() == [1] and option.get_shards_assignment() == [None]


def test_noop_models_rate_the_busiest_rank():
    topology = Topology(world_size=2, ddr_cap=100)
    perf = engine_options.Perf(fwd_compute=1.0, fwd_comms=1.0, bwd_compute=2.0, bwd_comms=0.0)
    shards = [
        Shard(size=[5, 4], offset=[0, 0], rank=0, perf=perf, storage=Storage(hbm=3, ddr=0)),
        Shard(size=[5, 4], offset=[5, 0], rank=1, perf=perf, storage=Storage(hbm=7, ddr=0)),
        Shard(size=[5, 4], offset=[5, 4], rank=1, perf=perf, storage=Storage(hbm=1, ddr=0)),
    ]
    option = MagicMock(shards=shards)
    assert NoopPerfModel(topology).rate([option]) == 8.0
    assert NoopStorageModel(topology).rate([option]) == 8


def test_torchrec_storage_rule_estimates_the_planners_own_options():
    topology = Topology(world_size=2, ddr_cap=10**9)
    tables = {"ebc": [EmbeddingBagConfig(1000, 16, name="t")]}
    (options,) = EmbeddingEnumerator(topology, batch_size=64).enumerate_tables(tables, {})
    EmbeddingStorageEstimator(topology).estimate(options)
    table_wise = next(o for o in options if o.sharding_type == "table_wise")
    # weights 1000 x 16 x 4, ids 64 x 2 ranks x 8, outputs 64 x 2 ranks x 16 x 4 (a meta weight: no optimizer)
    assert table_wise.shards[0].storage == Storage(hbm=0, ddr=64_000 + 1_024 + 8_192)
    assert all(isinstance(s.storage, Storage) for o in options for s in o.shards)
