"""The pipelined loop trains exactly like the plain loop: same losses and same weights, bit for bit."""

from __future__ import annotations

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

from rectrain.datasets import SyntheticConfig, build_dataset
from rectrain.distributed import DistributedModelParallel
from rectrain.embedding import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.models.dlrm import DLRM, DLRMTrain
from rectrain.train import TrainPipelineBase, TrainPipelineSparseDist
from tests.distributed.multiprocess import run_multiprocess

STEPS = 6


def _model() -> DLRMTrain:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=500, embedding_dim=8, feature_names=[f"cat_{i}"])
        for i in range(4)
    ]
    ebc = EmbeddingBagCollection(tables, fused_optimizer=FusedOptimizerConfig("rowwise_adagrad", lr=0.05))
    return DLRMTrain(
        DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    )


def _data(rank: int, world_size: int):
    config = SyntheticConfig.standard_workload(
        num_sparse=4, num_embeddings=500, batch_size=16 + 4 * rank, num_batches=STEPS, ids_per_feature=(0, 5)
    )
    return iter(build_dataset(config, rank=rank, world_size=world_size))


def _train(pipeline_class, model, rank: int, world_size: int) -> list[float]:
    dense = [p for _, p in model.named_parameters() if p.requires_grad]
    pipeline = pipeline_class(model, torch.optim.Adagrad(dense, lr=0.05), torch.device("cpu"))
    batches, losses = _data(rank, world_size), []
    while True:
        try:
            loss, _ = pipeline.progress(batches)
        except StopIteration:
            return losses
        losses.append(loss.item())


def _tables(model) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    return {
        f"{k}@{s.metadata.shard_offsets}": s.tensor.clone()
        for k, v in state.items()
        if isinstance(v, ShardedTensor)
        for s in v.local_shards()
    }


def _compare(env) -> int:
    plain = DistributedModelParallel(_model(), env=env, device="cpu", batch_size=16)
    piped = DistributedModelParallel(_model(), env=env, device="cpu", batch_size=16)
    (sharded,) = [m for m in piped.modules() if hasattr(m, "prefetch")]
    plain_losses = _train(TrainPipelineBase, plain, env.rank, env.world_size)
    piped_losses = _train(TrainPipelineSparseDist, piped, env.rank, env.world_size)
    assert len(plain_losses) == STEPS and plain_losses == piped_losses
    assert sharded._prefetched is None  # every prefetched input dist was picked up by its forward
    for (name, a), (_, b) in zip(plain.module.named_parameters(), piped.module.named_parameters()):
        assert torch.equal(a, b), name
    a, b = _tables(plain), _tables(piped)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return len(plain_losses)


def test_pipelined_training_matches_plain_loop_on_two_ranks():
    assert run_multiprocess(_compare, 2) == [STEPS, STEPS]


def test_pipeline_without_sharded_modules_runs_every_batch():
    losses = _train(TrainPipelineSparseDist, _model(), 0, 1)
    assert losses == _train(TrainPipelineBase, _model(), 0, 1)
    assert len(losses) == STEPS
