"""DistributedModelParallel on real gloo ranks: plans, shards, trains like the unsharded model, saves state.

Equivalence setup: every rank builds the same model (same seed). The reference trains on the global batch
with loss = sum over the global batch and dense SGD at lr / world_size; each rank trains on its slice with
loss = sum over its slice, DDP averages the dense gradients (hence the lr scaling) and the sharded tables
receive every rank's gradient. Tolerance atol 1e-5 / rtol 1e-4.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor

from rectrain.distributed import DistributedModelParallel, ShardingType
from rectrain.distributed.sharding_plan import row_wise
from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig
from rectrain.sparse import KeyedJaggedTensor
from tests.distributed.multiprocess import run_multiprocess

TOL = {"atol": 1e-5, "rtol": 1e-4}
ROWS = [60, 2000, 30]


class TwoTower(nn.Module):
    """An EBC nested one level down plus a dense layer: the shape of a real model."""

    def __init__(self) -> None:
        super().__init__()
        tables = [
            EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=8, feature_names=[f"f{i}"])
            for i, rows in enumerate(ROWS)
        ]
        self.sparse = nn.Module()
        self.sparse.ebc = EmbeddingBagCollection(
            tables, fused_optimizer=FusedOptimizerConfig("adagrad", lr=0.1)
        )
        self.dense = nn.Linear(3 * 8, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense(self.sparse.ebc(kjt).values()).squeeze(1)


def _batch(step: int, batch_sizes: list[int], rank: int | None) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    """The global batch (rank None) or one rank's slice of it; same ids on every rank."""
    gen = torch.Generator().manual_seed(step)
    total = sum(batch_sizes)
    lengths = torch.randint(0, 4, (len(ROWS), total), generator=gen)
    ids = [torch.randint(0, rows, (int(lengths[i].sum()),), generator=gen) for i, rows in enumerate(ROWS)]
    target = torch.randn(total, generator=gen)
    lo, hi = (0, total) if rank is None else (sum(batch_sizes[:rank]), sum(batch_sizes[: rank + 1]))
    starts = [int(lengths[i, :lo].sum()) for i in range(len(ROWS))]
    ends = [int(lengths[i, :hi].sum()) for i in range(len(ROWS))]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(len(ROWS))],
        values=torch.cat([ids[i][starts[i] : ends[i]] for i in range(len(ROWS))]),
        lengths=lengths[:, lo:hi].reshape(-1),
    )
    return kjt, target[lo:hi]


def _train(env, plan_rows_wise: bool) -> dict:
    torch.manual_seed(0)
    model = TwoTower()
    reference = copy.deepcopy(model)
    plan = None
    if plan_rows_wise:
        from rectrain.distributed.sharding_plan import construct_module_sharding_plan
        from rectrain.planner import ShardingPlan

        tables = model.sparse.ebc.embedding_bag_configs()
        module_plan = construct_module_sharding_plan(
            tables, {t.name: row_wise() for t in tables}, world_size=env.world_size
        )
        shapes = {t.name: (t.num_embeddings, t.embedding_dim) for t in tables}
        plan = ShardingPlan({"sparse.ebc": module_plan}, env.world_size, {"sparse.ebc": shapes})
    dmp = DistributedModelParallel(model, env=env, device="cpu", plan=plan, batch_size=8)
    dense_params = [p for _, p in dmp.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(dense_params, lr=0.05)
    ref_optimizer = torch.optim.SGD(reference.dense.parameters(), lr=0.05)
    batch_sizes = [4 + r for r in range(env.world_size)]
    for step in range(5):
        kjt, target = _batch(step, batch_sizes, env.rank)
        global_kjt, global_target = _batch(step, batch_sizes, None)
        mine = slice(sum(batch_sizes[: env.rank]), sum(batch_sizes[: env.rank + 1]))
        expected = reference(global_kjt)
        ref_optimizer.zero_grad()
        # DDP and the sharded tables both train on the mean of the ranks' losses.
        ((expected * global_target).sum() / env.world_size).backward()
        ref_optimizer.step()
        got = dmp(kjt)
        optimizer.zero_grad()
        (got * target).sum().backward()
        optimizer.step()
        dmp.fused_optimizer.step()
        torch.testing.assert_close(got, expected[mine].detach(), **TOL)
    torch.testing.assert_close(dmp.module.dense.weight, reference.dense.weight, **TOL)
    state = dmp.state_dict()
    for key, value in state.items():
        if isinstance(value, ShardedTensor):
            full = reference.state_dict()[key]
            for shard in value.local_shards():
                (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                torch.testing.assert_close(shard.tensor, full[row : row + rows, col : col + cols])
    # Loading the unsharded model's full tables back writes every rank's rectangles.
    with torch.no_grad():
        for value in state.values():
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    shard.tensor.zero_()
    dmp.load_state_dict(reference.state_dict())
    after = dmp.state_dict()
    restored = all(
        torch.equal(
            s.tensor,
            reference.state_dict()[k][
                s.metadata.shard_offsets[0] : s.metadata.shard_offsets[0] + s.metadata.shard_sizes[0],
                s.metadata.shard_offsets[1] : s.metadata.shard_offsets[1] + s.metadata.shard_sizes[1],
            ],
        )
        for k, v in after.items()
        if isinstance(v, ShardedTensor)
        for s in v.local_shards()
    )
    kinds = {name: s.sharding_type.value for name, s in dmp.plan.get_plan_for_module("sparse.ebc").items()}
    return {"restored": restored, "kinds": kinds, "keys": sorted(k for k in state if "ebc" in k)}


def test_planned_dmp_trains_like_unsharded_model_and_round_trips_state():
    results = run_multiprocess(_train, 2, False)
    assert results[0] == results[1]  # one plan for all ranks
    assert results[0]["restored"]
    assert results[0]["keys"] == [
        "sparse.ebc.embedding_bags.t0.weight",
        "sparse.ebc.embedding_bags.t1.weight",
        "sparse.ebc.embedding_bags.t2.weight",
    ]


def test_given_row_wise_plan_over_three_ranks():
    results = run_multiprocess(_train, 3, True)
    assert all(r["restored"] for r in results)
    assert set(results[0]["kinds"].values()) == {ShardingType.ROW_WISE.value}


class SequenceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        tables = [
            EmbeddingConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=8, feature_names=[f"f{i}"])
            for i, rows in enumerate(ROWS)
        ]
        self.ec = EmbeddingCollection(tables, fused_optimizer=FusedOptimizerConfig("sgd", lr=0.1))

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return torch.cat([jt.values() for jt in self.ec(kjt).values()])


def _sequence(env) -> bool:
    torch.manual_seed(0)
    model = SequenceModel()
    reference = copy.deepcopy(model)
    dmp = DistributedModelParallel(model, env=env, device="cpu", batch_size=8)
    batch_sizes = [3, 6]
    for step in range(3):
        kjt, _ = _batch(step, batch_sizes, env.rank)
        global_kjt, _ = _batch(step, batch_sizes, None)
        expected = reference.ec(global_kjt)
        got = dmp.module.ec(kjt)
        mine = slice(sum(batch_sizes[: env.rank]), sum(batch_sizes[: env.rank + 1]))
        for key, jt in got.items():
            offsets = expected[key].offsets()
            rows = expected[key].values()[int(offsets[mine.start]) : int(offsets[mine.stop])]
            torch.testing.assert_close(jt.values(), rows.detach(), **TOL)
        (sum(v.values().sum() for v in expected.values()) / env.world_size).backward()
        sum(v.values().sum() for v in got.values()).backward()
    return sorted(k for k, v in dmp.state_dict().items() if isinstance(v, (ShardedTensor, torch.Tensor)))


def test_dmp_shards_an_embedding_collection():
    keys = ["ec.embeddings.t0.weight", "ec.embeddings.t1.weight", "ec.embeddings.t2.weight"]
    assert run_multiprocess(_sequence, 2) == [keys, keys]
