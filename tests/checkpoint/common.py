"""A small DLRM, deterministic batches, plans of mixed sharding types, and state capture for checkpoint tests.

Functions here run inside spawned ranks (``run_multiprocess``), so they live at module level.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rectrain.checkpoint import model_state
from rectrain.distributed import DistributedModelParallel
from rectrain.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.models import DLRM, Batch, DLRMTrain
from rectrain.optim import CombinedOptimizer
from rectrain.planner import ShardingPlan
from rectrain.sparse import KeyedJaggedTensor

ROWS = [40, 64, 30]
DIM = 8
DENSE_IN = 4
BATCH = 4
EBC_PATH = "model.sparse_arch.embedding_bag_collection"

# Per world size, a plan mixing sharding types (by table: t0, t1, t2).
PLANS = {
    "tw_rw_cw": lambda: {"t0": table_wise(0), "t1": row_wise(), "t2": column_wise([0, 1])},
    "rw_cw_tw": lambda: {"t0": row_wise(), "t1": column_wise([0, 1]), "t2": table_wise(2)},
    "cw_dp_rw": lambda: {"t0": column_wise([1, 0]), "t1": data_parallel(), "t2": row_wise()},
}


def tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=DIM, feature_names=[f"f{i}"])
        for i, rows in enumerate(ROWS)
    ]


def build_model(
    seed: int, optimizer: str = "rowwise_adagrad", rows: list[int] | None = None, cpu_backward: str = "auto"
) -> DLRMTrain:
    torch.manual_seed(seed)
    configs = tables()
    if rows is not None:
        configs = [
            EmbeddingBagConfig(
                name=c.name, num_embeddings=n, embedding_dim=DIM, feature_names=c.feature_names
            )
            for c, n in zip(configs, rows)
        ]
    fused = FusedOptimizerConfig(optimizer, lr=0.05, cpu_backward=cpu_backward)
    ebc = EmbeddingBagCollection(configs, fused_optimizer=fused)
    return DLRMTrain(DLRM(ebc, DENSE_IN, [16, DIM], [16, 1]))


def plan_for(name: str, world_size: int) -> ShardingPlan:
    module_plan = construct_module_sharding_plan(tables(), PLANS[name](), world_size=world_size)
    shapes = {t.name: (t.num_embeddings, t.embedding_dim) for t in tables()}
    return ShardingPlan({EBC_PATH: module_plan}, world_size, {EBC_PATH: shapes})


def shard(model: nn.Module, env, plan: str | None) -> nn.Module:
    if plan is None:
        return model
    return DistributedModelParallel(model, env=env, device="cpu", plan=plan_for(plan, env.world_size))


def make_optimizer(model: nn.Module) -> CombinedOptimizer:
    dense = [p for _, p in model.named_parameters() if p.requires_grad]
    fused = model.fused_optimizer if isinstance(model, DistributedModelParallel) else None
    if fused is None:
        fused = model_state.unwrap(model).model.sparse_arch.embedding_bag_collection.fused_optimizer
    return CombinedOptimizer([("dense", torch.optim.Adagrad(dense, lr=0.05)), ("sparse", fused)])


def batch(step: int, rank: int) -> Batch:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 4, (len(ROWS), BATCH), generator=gen)
    ids = [torch.randint(0, rows, (int(lengths[i].sum()),), generator=gen) for i, rows in enumerate(ROWS)]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(len(ROWS))], values=torch.cat(ids), lengths=lengths.reshape(-1)
    )
    dense = torch.randn(BATCH, DENSE_IN, generator=gen)
    return Batch(dense, kjt, torch.randint(0, 2, (BATCH,), generator=gen))


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, rank: int) -> None:
    for step in steps:
        loss, _ = model(batch(step, rank))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def capture(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """This rank's state as plain cpu tensors: table pieces (weight + fused state), dense, dense optimizer."""
    pieces = {
        key: [
            (
                (p.shard.row_offset, p.shard.num_rows, p.shard.col_offset, p.shard.num_cols),
                p.weight.detach().clone(),
                {n: s.detach().clone() for n, s in p.states.items()},
            )
            for p in table.pieces
        ]
        for key, table in model_state.local_tables(model).items()
    }
    dense = {k: v.detach().clone() for k, v in model_state.dense_state(model).items()}
    optim = None
    if optimizer is not None:
        state = dict(optimizer.optimizers)["dense"].state_dict()["state"]
        optim = {i: {k: v.clone() for k, v in s.items()} for i, s in state.items()}
    return {"pieces": pieces, "dense": dense, "optim": optim}


def full_tables(captures: list[dict]) -> dict[str, dict[str, Tensor]]:
    """Assemble every table's weight and per-element state from all ranks' pieces; per-row state is merged
    by the width-weighted mean the loader uses."""
    out: dict[str, dict[str, Tensor]] = {}
    for cap in captures:
        for key, pieces in cap["pieces"].items():
            for (r0, nr, c0, nc), weight, states in pieces:
                slot = out.setdefault(key, {})
                for name, value in [("weight", weight), *states.items()]:
                    if name == "step":
                        slot[name] = value
                    elif value.dim() == 2:
                        full = slot.setdefault(name, torch.full((max(ROWS), DIM), float("nan")))
                        full[r0 : r0 + nr, c0 : c0 + nc] = value
                    else:
                        acc = slot.setdefault(name, torch.zeros(max(ROWS), dtype=torch.float64))
                        acc[r0 : r0 + nr] += value.double() * nc / DIM
    return out


def expected_piece(full: dict[str, Tensor], name: str, rect: tuple[int, int, int, int]) -> Tensor:
    """The expected value of one target piece (per-row: the full-row value, broadcast to column shards)."""
    r0, nr, c0, nc = rect
    value = full[name]
    if name == "step":
        return value
    if value.dim() == 2:
        return value[r0 : r0 + nr, c0 : c0 + nc]
    return value[r0 : r0 + nr].float()


def mismatches(a: dict, b: dict) -> list[str]:
    """Names of every tensor that differs (bitwise) between two captures of the same layout."""
    bad = []
    for key, pieces in a["pieces"].items():
        for (rect, weight, states), (_, weight2, states2) in zip(pieces, b["pieces"][key]):
            bad += [f"{key}{rect} weight"] if not torch.equal(weight, weight2) else []
            bad += [f"{key}{rect} {n}" for n in states if not torch.equal(states[n], states2[n])]
    bad += [f"dense {k}" for k in a["dense"] if not torch.equal(a["dense"][k], b["dense"][k])]
    for i, state in (a["optim"] or {}).items():
        bad += [f"optim {i}.{k}" for k in state if not torch.equal(state[k], b["optim"][i][k])]
    return bad
