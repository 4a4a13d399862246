"""A DMP state dict moves to CPU and gathers into an unsharded model, TorchRec's way (2 gloo ranks)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from rectrain.distributed import DistributedModelParallel
from rectrain.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.inference.state_dict_transform import state_dict_gather, state_dict_to_device
from rectrain.planner import ShardingPlan
from tests.distributed.multiprocess import run_multiprocess

TABLES = [EmbeddingBagConfig(name="t0", num_embeddings=30, embedding_dim=4, feature_names=["f0"])]


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=TABLES)
        self.head = nn.Linear(4, 1)


def _gather(env) -> dict:
    torch.manual_seed(0)
    reference = Model()
    module_plan = construct_module_sharding_plan(TABLES, {"t0": row_wise()}, world_size=env.world_size)
    plan = ShardingPlan({"ebc": module_plan}, env.world_size, {"ebc": {"t0": (30, 4)}})
    dmp = DistributedModelParallel(Model(), env=env, device=torch.device("cpu"), plan=plan)
    dmp.load_state_dict(reference.state_dict())
    moved = state_dict_to_device(dmp.state_dict(), pg=env.pg, device=torch.device("cpu"))
    target = Model()
    with torch.no_grad():
        for tensor in target.state_dict().values():
            tensor.zero_()
    state_dict_gather(moved, target.state_dict())
    dist.barrier(env.pg)
    same = {k: torch.equal(v, reference.state_dict()[k]) for k, v in target.state_dict().items()}
    return {"rank": env.rank, "same": same}


def test_sharded_tables_gather_on_rank_zero_and_dense_everywhere():
    first, second = run_multiprocess(_gather, 2)
    assert all(first["same"].values())
    assert second["same"] == {"ebc.embedding_bags.t0.weight": False, "head.weight": True, "head.bias": True}
