"""DistributedModelParallel takes the sharded tables' optimizer the way TorchRec takes it, or refuses it.

``apply_optimizer_in_backward`` on the tables and the sharder's ``fused_params`` choose the fused kernel
(per table, the former over the latter); a collection built with ``fused_optimizer=`` keeps its own; nothing
given means FBGEMM's exact SGD at lr 0.01, as in TorchRec, with a warning. Data-parallel tables with the
``dense`` kernel are parameters that DDP all-reduces and the user's optimizer steps.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig, KeyedJaggedTensor
from rectrain.distributed.embeddingbag import EmbeddingBagCollectionSharder
from rectrain.distributed.model_parallel import DistributedModelParallel
from rectrain.distributed.parallel import fused_params
from rectrain.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from rectrain.embedding.config import EmbOptimType
from rectrain.errors import ConfigError
from rectrain.optim.optimizers import in_backward_optimizer_filter
from rectrain.optim.rowwise_adagrad import RowWiseAdagrad
from tests.distributed.multiprocess import run_multiprocess


def _ebc(device: str | None = None) -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=20, feature_names=[f"f{i}"])
        for i in range(2)
    ]
    return EmbeddingBagCollection(tables, device=device)


def _weights(ebc: EmbeddingBagCollection) -> dict[str, torch.Tensor]:
    return fused_params.table_weights(ebc.embedding_bag_configs(), ebc, "embedding_bags")


def test_in_backward_optimizer_wins_over_the_sharders_fused_params():
    ebc = _ebc()
    apply_optimizer_in_backward(torch.optim.Adam, ebc.parameters(), {"lr": 0.05, "betas": (0.8, 0.9)})
    config = fused_params.resolve("m", None, _weights(ebc), {"optimizer": "exact_sgd", "learning_rate": 0.5})
    assert (config.optimizer, config.lr, config.beta1, config.beta2) == (EmbOptimType.ADAM, 0.05, 0.8, 0.9)
    plain = fused_params.resolve(
        "m", None, _weights(_ebc()), {"optimizer": "EXACT_ROWWISE_ADAGRAD", "eps": 1e-6}
    )
    assert (plain.optimizer, plain.lr, plain.eps) == (EmbOptimType.ROWWISE_ADAGRAD, 0.01, 1e-6)


def test_nothing_given_is_fbgemms_default_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="rectrain.distributed.parallel.fused_params"):
        config = fused_params.resolve("sparse", None, _weights(_ebc()), None)
    assert (config.optimizer, config.lr) == (EmbOptimType.SGD, 0.01)
    assert "FBGEMM's default" in caplog.text and "apply_optimizer_in_backward" in caplog.text


def test_what_cannot_be_honoured_is_refused():
    ebc = _ebc()
    apply_optimizer_in_backward(torch.optim.RMSprop, ebc.parameters(), {"lr": 0.1})
    with pytest.raises(ConfigError, match="RMSprop has no fused kernel"):
        fused_params.resolve("m", None, _weights(ebc), None)
    ebc = _ebc()
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.1, "momentum": 0.9})
    with pytest.raises(ConfigError, match="momentum=0.9 is not supported"):
        fused_params.resolve("m", None, _weights(ebc), None)
    ebc = _ebc()
    apply_optimizer_in_backward(torch.optim.SGD, [ebc.embedding_bags["t0"].weight], {"lr": 0.1})
    with pytest.raises(ConfigError, match="different in-backward optimizers"):
        fused_params.resolve("m", None, _weights(ebc), None)
    with pytest.raises(ConfigError, match="built with fused_optimizer=.*give it one way"):
        fused_params.resolve("m", FusedOptimizerConfig(), _weights(_ebc()), {"optimizer": "exact_sgd"})


def _batch(rank: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(rank)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"],
        values=torch.randint(0, 20, (8,), generator=gen),
        lengths=torch.ones(8, dtype=torch.int64),
    )


def _train(env, device: str) -> dict:
    torch.manual_seed(0)
    ebc = _ebc(device)  # "meta": TorchRec's golden_training builds its collection there
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.1})
    constraints = {
        "t0": ParameterConstraints(compute_kernels=["dense"]),
        "t1": ParameterConstraints(sharding_types=["table_wise"]),
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints
    )
    plan = planner.collective_plan(ebc, [EmbeddingBagCollectionSharder()], env.pg)
    dmp = DistributedModelParallel(
        ebc, device=torch.device("cpu"), plan=plan, sharders=[EmbeddingBagCollectionSharder()]
    )
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    user = RowWiseAdagrad(list(dense.values()), lr=0.1)
    before = {k: v.clone() for k, v in dmp.state_dict().items() if isinstance(v, torch.Tensor)}
    dmp(_batch(env.rank)).values().sum().backward()
    user.step()
    after = dmp.state_dict()
    t1 = before["embedding_bags.t1.weight"]
    return {
        "initial": {
            "t0": before["embedding_bags.t0.weight"],
            "t1": [(s.metadata.shard_offsets, s.tensor) for s in t1.local_shards()],
        },
        "dense": sorted(dense),
        "fused": (dmp.fused_optimizer.optimizer_type.value, dmp.fused_optimizer.param_groups[0]["lr"]),
        "keys": sorted(dmp.fused_optimizer.state_dict()["state"]),
        "t0": after["embedding_bags.t0.weight"],
        "t0_moved": not torch.equal(after["embedding_bags.t0.weight"], before["embedding_bags.t0.weight"]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_dmp_honours_apply_optimizer_in_backward_and_dense_data_parallel_tables(device):
    results = run_multiprocess(_train, 2, device)
    torch.manual_seed(0)
    unsharded = _ebc()
    held = 0
    for result in results:
        # Built on the meta device or not, each rank starts from the unsharded collection's values: the
        # data-parallel table whole, the table-wise one on the rank that holds it.
        assert torch.equal(result["initial"]["t0"], unsharded.embedding_bags["t0"].weight)
        for offsets, shard in result["initial"]["t1"]:
            if shard.numel() == 0:
                continue  # the rank without t1
            rows = slice(offsets[0], offsets[0] + shard.shape[0])
            assert torch.equal(shard, unsharded.embedding_bags["t1"].weight[rows, offsets[1] :])
            held += shard.numel()
        assert result["dense"] == ["data_parallel.tables.t0.weight"]
        assert result["fused"] == ("rowwise_adagrad", 0.1)
        assert result["keys"] == ["embedding_bags.t1.weight"]
        assert result["t0_moved"]
    assert held == unsharded.embedding_bags["t1"].weight.numel()
    # DDP averaged the replicas' gradients, so the user's optimizer kept them identical.
    assert torch.equal(results[0]["t0"], results[1]["t0"])
