"""One run of TorchRec's ``examples/golden_training`` setup, importable from ``torchrec`` or ``rectrain``.

The example's model and optimizers at a reduced size: ``DLRMTrain(DLRM(EmbeddingBagCollection))`` over the
Criteo feature names, ``apply_optimizer_in_backward(RowWiseAdagrad)`` on the tables,
``DistributedModelParallel`` with ``EmbeddingBagCollectionSharder`` (1 gloo rank), ``KeyedOptimizerWrapper``
(Adagrad) over ``in_backward_optimizer_filter(model.named_parameters())`` and ``TrainPipelineSparseDist``.
Run as ``python golden_training_parity_job.py <torchrec|rectrain> <dir>``: the first run writes its state
dict after ``DistributedModelParallel`` and ``RandomRecDataset``'s batches to ``<dir>``, later runs copy that
state into their model and train on the same batches; each writes its per-step losses and final tables.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from pathlib import Path

import torch
from torch import distributed as dist
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

NUM_EMBEDDINGS, DIM, BATCH, STEPS, LR = 100, 16, 32, 20, 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _full(value: torch.Tensor) -> torch.Tensor | None:
    """The whole tensor on rank 0 (a sharded table gathered from every rank); None on the other ranks."""
    if not hasattr(value, "local_shards"):
        return value.detach().clone() if dist.get_rank() == 0 else None
    out = torch.empty(value.size()) if dist.get_rank() == 0 else None
    value.gather(dst=0, out=out)
    return out


def _load(value: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` into the live tensor (each local shard its rectangle of it)."""
    if not hasattr(value, "local_shards"):
        value.copy_(full)
        return
    for shard in value.local_shards():
        (r, c), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
        shard.tensor.copy_(full[r : r + rows, c : c + cols])


def _batches(package: str, saved: list[dict[str, torch.Tensor]], keys: list[str]) -> list:
    utils = importlib.import_module(f"{package}.datasets.utils")
    sparse = importlib.import_module(f"{package}.sparse.jagged_tensor")
    return [
        utils.Batch(
            dense_features=b["dense"],
            sparse_features=sparse.KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=b["values"], lengths=b["lengths"]
            ),
            labels=b["labels"],
        )
        for b in saved
    ]


def _dataset(package: str, keys: list[str], num_dense: int) -> list[dict[str, torch.Tensor]]:
    random_data = importlib.import_module(f"{package}.datasets.random")
    it = iter(
        random_data.RandomRecDataset(
            keys=keys, batch_size=BATCH, hash_size=NUM_EMBEDDINGS, ids_per_feature=1, num_dense=num_dense
        )
    )
    out = []
    for _ in range(STEPS * dist.get_world_size()):
        b = next(it)
        kjt = b.sparse_features
        out.append(
            {"dense": b.dense_features, "values": kjt.values(), "lengths": kjt.lengths(), "labels": b.labels}
        )
    return out


def main(package: str, out: Path) -> None:
    criteo = importlib.import_module(f"{package}.datasets.criteo")
    configs = importlib.import_module(f"{package}.modules.embedding_configs")
    modules = importlib.import_module(f"{package}.modules.embedding_modules")
    dlrm = importlib.import_module(f"{package}.models.dlrm")
    distributed = importlib.import_module(f"{package}.distributed")
    embeddingbag = importlib.import_module(f"{package}.distributed.embeddingbag")
    model_parallel = importlib.import_module(f"{package}.distributed.model_parallel")
    keyed = importlib.import_module(f"{package}.optim.keyed")
    optimizers = importlib.import_module(f"{package}.optim.optimizers")
    rowwise = importlib.import_module(f"{package}.optim.rowwise_adagrad")

    if "RANK" not in os.environ:  # one rank, without torchrun
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    keys, num_dense = list(criteo.DEFAULT_CAT_NAMES), len(criteo.DEFAULT_INT_NAMES)
    tables = [
        configs.EmbeddingBagConfig(
            name=f"t_{name}", embedding_dim=DIM, num_embeddings=NUM_EMBEDDINGS, feature_names=[name]
        )
        for name in keys
    ]
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    train_model = dlrm.DLRMTrain(
        dlrm.DLRM(
            embedding_bag_collection=modules.EmbeddingBagCollection(tables=tables, device=cpu),
            dense_in_features=num_dense,
            dense_arch_layer_sizes=[64, DIM],
            over_arch_layer_sizes=[64, 1],
            dense_device=cpu,
        )
    )
    apply_optimizer_in_backward(
        rowwise.RowWiseAdagrad, train_model.model.sparse_arch.parameters(), {"lr": LR}
    )
    model = model_parallel.DistributedModelParallel(
        module=train_model, device=cpu, sharders=[embeddingbag.EmbeddingBagCollectionSharder()]
    )
    # Both libraries' DMP initialise the sharded tables afresh, so the shared start is the first run's state
    # after DMP (whole tables), copied into the live tensors that the state dict views.
    state = model.state_dict()
    start = out / f"initial{world_size}.pt"
    if not start.exists():
        full = {k: _full(v) for k, v in state.items()}
        torch.manual_seed(1)
        data = _dataset(package, keys, num_dense)
        if rank == 0:
            torch.save({"state": full, "data": data}, start)
    dist.barrier()
    saved = torch.load(start, weights_only=True)
    assert saved["state"].keys() == state.keys(), sorted(saved["state"].keys() ^ state.keys())
    with torch.no_grad():
        for key, value in saved["state"].items():
            _load(state[key], value)
    loaded = {k: _full(v) for k, v in model.state_dict().items()}
    assert rank or all(torch.equal(loaded[k], v) for k, v in saved["state"].items())
    dense_optimizer = keyed.KeyedOptimizerWrapper(
        dict(optimizers.in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=LR),
    )
    pipeline = distributed.TrainPipelineSparseDist(model, dense_optimizer, cpu)
    batches = iter(_batches(package, saved["data"][rank::world_size], keys))
    losses = []
    for _ in range(STEPS):
        # progress returns the model's second output: DLRMTrain's (loss, logits, labels), detached.
        losses.append(pipeline.progress(batches)[0].item())
    tables_after = {k: _full(v) for k, v in model.state_dict().items() if "embedding_bags" in k}
    gathered = [None] * world_size
    dist.all_gather_object(gathered, losses)
    if rank == 0:  # losses[rank][step]: each rank's loss on its own batch
        torch.save({"losses": gathered, "tables": tables_after}, out / f"{package}{world_size}.pt")
    dist.barrier()
    dist.destroy_process_group()
    # As tests/export/torchrec_dlrm_job.py: a rank that ran gloo collectives can abort in interpreter
    # finalization ("terminate called without an active exception"); everything is on disk by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
