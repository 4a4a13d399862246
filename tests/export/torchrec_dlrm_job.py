"""Runs in the TorchRec reference venv (not ours), under ``torchrun``: trains a small TorchRec DLRM with
DistributedModelParallel on gloo, saves it with ``torch.distributed.checkpoint`` (model and fused optimizer
state), and writes TorchRec's own forward logits on a fixed set of requests to ``requests.safetensors``.

    torchrun --standalone --nproc_per_node 2 torchrec_dlrm_job.py --out DIR --kind dlrm [--kind dlrm_dcn]

For each kind (one after the other in the same ranks: one launch instead of one per kind), writes
``DIR/KIND/checkpoint`` (the DCP directory), ``DIR/KIND/model.json`` (our ModelConfig of the model)
and ``DIR/KIND/requests.safetensors`` (``dense``, ``values``, ``lengths`` of each request and TorchRec's
``logits``).
Tables: t_tw0/t_tw1 table-wise, t_cw column-wise (2 shards), t_twcw table-column-wise,
t_dp data-parallel (TorchRec on CPU offers no row-wise sharding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

DIM = 16
DENSE = 5
TABLES = {  # name: (rows, features, sharding type)
    "t_tw0": (60, ["f0"], "table_wise"),
    "t_tw1": (40, ["f1", "g1"], "table_wise"),
    "t_cw": (50, ["f2"], "column_wise"),
    "t_twcw": (70, ["f3"], "table_column_wise"),
    "t_dp": (20, ["f4"], "data_parallel"),
}
FEATURES = [f for _, features, _ in TABLES.values() for f in features]
ROWS_OF = {f: rows for rows, features, _ in TABLES.values() for f in features}


def model_config(kind: str) -> dict:
    tables = [
        {"name": name, "num_embeddings": rows, "embedding_dim": DIM, "feature_names": features}
        for name, (rows, features, _) in TABLES.items()
    ]
    config = {
        "kind": kind,
        "tables": tables,
        "dense_in_features": DENSE,
        "dense_arch_layer_sizes": [32, DIM],
        "over_arch_layer_sizes": [32, 1],
    }
    if kind == "dlrm_dcn":
        config.update(dcn_num_layers=2, dcn_low_rank_dim=8)
    return config


def build(kind: str) -> DLRMTrain:
    cfg = model_config(kind)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t["name"], num_embeddings=t["num_embeddings"], embedding_dim=DIM,
                feature_names=t["feature_names"],
            )
            for t in cfg["tables"]
        ],
        device=torch.device("meta"),
    )  # fmt: skip
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=DENSE,
        dense_arch_layer_sizes=cfg["dense_arch_layer_sizes"],
        over_arch_layer_sizes=cfg["over_arch_layer_sizes"],
    )
    if kind == "dlrm_dcn":
        dlrm = DLRM_DCN(**common, dcn_num_layers=2, dcn_low_rank_dim=8)
    else:
        dlrm = DLRM(**common)
    return DLRMTrain(dlrm)


def batch(size: int, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(FEATURES), size), generator=gen)
    values = torch.cat(
        [
            torch.randint(0, ROWS_OF[f], (int(lengths[i].sum()),), generator=gen)
            for i, f in enumerate(FEATURES)
        ]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths.reshape(-1))
    dense = torch.randn(size, DENSE, generator=gen)
    return Batch(
        dense_features=dense, sparse_features=kjt, labels=torch.randint(0, 2, (size,), generator=gen)
    )


def shard(model: DLRMTrain, world_size: int) -> DistributedModelParallel:
    ebc = model.model.sparse_arch.embedding_bag_collection
    apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.05})
    constraints = {
        name: ParameterConstraints(sharding_types=[sharding], min_partition=DIM // 2)
        for name, (_, _, sharding) in TABLES.items()
    }
    topology = Topology(world_size=world_size, compute_device="cpu", local_world_size=world_size)
    sharders = [EmbeddingBagCollectionSharder()]
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(
        model, sharders, dist.GroupMember.WORLD
    )
    return DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)


def train_and_save(kind: str, steps: int, out: Path) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    dmp = shard(build(kind), world_size)
    dense_optimizer = torch.optim.Adam(
        [p for n, p in dmp.named_parameters() if "embedding_bags" not in n], lr=0.01
    )
    dmp.train()
    for step in range(steps):
        loss, _ = dmp(batch(32, seed=1000 * step + rank))
        dense_optimizer.zero_grad()
        loss.backward()
        dense_optimizer.step()

    state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
    dcp.save(state, checkpoint_id=str(out / "checkpoint"))

    # Every rank scores the same requests, so each rank's output is TorchRec's forward on all of them.
    requests = batch(24, seed=7)
    dmp.eval()
    with torch.no_grad():
        _, (_, logits, _) = dmp(requests)
    if rank == 0:
        kjt = requests.sparse_features
        save_file(
            {
                "dense": requests.dense_features.contiguous(),
                "values": kjt.values().contiguous(),
                "lengths": kjt.lengths().contiguous(),
                "logits": logits.contiguous(),
            },
            str(out / "requests.safetensors"),
            metadata={"keys": json.dumps(FEATURES)},
        )
        (out / "model.json").write_text(json.dumps(model_config(kind), indent=1))
        print(json.dumps(sorted(dmp.state_dict())))
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--kind", action="append", choices=["dlrm", "dlrm_dcn"], required=True)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    for kind in args.kind:
        train_and_save(kind, args.steps, Path(args.out) / kind)
    dist.destroy_process_group()
    # A rank that ran gloo collectives can abort in interpreter finalization ("terminate called without an
    # active exception"), which torchrun reports as a failed job; everything is on disk by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
