"""The planner's per-rank memory estimate against what a rank really holds, and plans refused before any
allocation when they do not fit."""

from __future__ import annotations

import pytest
import torch

from rectrain.distributed import DistributedModelParallel
from rectrain.distributed.sharding_plan import construct_module_sharding_plan, table_wise
from rectrain.embedding import EmbeddingBagCollection, EmbeddingBagConfig
from rectrain.embedding.config import FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.models import DLRM
from rectrain.planner import ShardingPlan, Topology
from rectrain.planner.memory import rank_memory
from rectrain.sparse import KeyedJaggedTensor
from tests.distributed.multiprocess import run_multiprocess

ROWS, DIM, BATCH = 1_500_000, 128, 256
SHAPES = {"t0": (ROWS, DIM), "t1": (ROWS, DIM)}


def _tables() -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM) for i in range(2)]


def _model() -> DLRM:
    ebc = EmbeddingBagCollection(_tables(), device="meta", fused_optimizer=FusedOptimizerConfig())
    return DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[64, DIM], over_arch_layer_sizes=[64, 1])


def _plan(world_size: int) -> ShardingPlan:
    ebc = EmbeddingBagCollection(_tables(), device="meta", fused_optimizer=FusedOptimizerConfig())
    generators = {"t0": table_wise(0), "t1": table_wise(world_size - 1)}
    module = construct_module_sharding_plan(ebc, generators, world_size=world_size)
    path = "sparse_arch.embedding_bag_collection"
    return ShardingPlan({path: module}, world_size, {path: SHAPES})


def _peak_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM"))
    return int(line.split()[1]) * 1024


def _train_and_measure(env) -> tuple[int, int]:
    torch.manual_seed(0)
    model = DistributedModelParallel(
        _model(), env=env, device="cpu", plan=_plan(env.world_size), batch_size=BATCH
    )
    gen = torch.Generator().manual_seed(env.rank)
    for _ in range(3):
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=["t0", "t1"],
            values=torch.randint(0, ROWS, (2 * BATCH * 4,), generator=gen),
            lengths=torch.full((2 * BATCH,), 4),
        )
        model(torch.randn(BATCH, 13, generator=gen), kjt).sum().backward()
    dense = sum(p.numel() * 4 for n, p in model.named_parameters() if "embedding_bags" not in n)
    return _peak_bytes(), dense


def test_estimate_is_within_15_percent_of_the_measured_peak():
    measured = run_multiprocess(_train_and_measure, 2)
    plan = _plan(2)
    model = _model()
    tables = {"sparse_arch.embedding_bag_collection": _tables()}
    config = model.sparse_arch.embedding_bag_collection.fused_optimizer_config
    for rank, (peak, dense) in enumerate(measured):
        estimate = rank_memory(plan, tables, config, BATCH, dense)[rank].total
        assert abs(estimate - peak) <= 0.15 * peak, f"rank {rank}: estimate {estimate:,}, measured {peak:,}"


def _refused(env) -> str:
    small = Topology(world_size=env.world_size, local_world_size=env.world_size, ddr_cap=1_000_000_000)
    try:
        DistributedModelParallel(_model(), env=env, device="cpu", plan=_plan(env.world_size), topology=small)
    except ConfigError as error:
        return str(error)
    return "not refused"


def test_plan_that_does_not_fit_is_refused_naming_rank_and_numbers():
    message = run_multiprocess(_refused, 2)[0]
    assert message.startswith("the sharding plan does not fit this machine: rank 0 would need "), message
    assert "tables 0.77" in message and "but may use 1.00 GB" in message


def test_estimate_counts_replicas_and_state():
    ebc = EmbeddingBagCollection(_tables(), device="meta", fused_optimizer=FusedOptimizerConfig())
    module = construct_module_sharding_plan(ebc, {"t0": table_wise(1), "t1": table_wise(1)}, world_size=2)
    plan = ShardingPlan({"": module}, 2, {"": SHAPES})
    config = ebc.fused_optimizer_config
    idle, busy = rank_memory(plan, {"": _tables()}, config, BATCH)
    assert idle.tables == 0 and busy.tables == 2 * ROWS * DIM * 4
    assert busy.optimizer == 2 * ROWS * 4  # row-wise Adagrad: one fp32 per row
    with pytest.raises(ConfigError, match="rank 1 would need"):
        from rectrain.planner.memory import check_fits

        check_fits([idle, busy], [10**10, 10**9], "the sharding plan does not fit this machine")
