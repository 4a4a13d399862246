"""Every model kind under DistributedModelParallel on 2 real gloo ranks: same logits as unsharded, trains."""

import pytest
import torch

from rectrain import FusedOptimizerConfig
from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.models import build_model, build_train_model, evaluate_recall_at_k
from tests.distributed.multiprocess import run_multiprocess
from tests.models.test_factory import KINDS, batch, config

OPTIMIZER = FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=0.1)


def _kind_under_dmp(kind: str, env: ShardingEnv) -> dict:
    torch.manual_seed(0)
    reference = build_model(config(kind), fused_optimizer=OPTIMIZER)
    torch.manual_seed(0)
    dmp = DistributedModelParallel(
        build_train_model(config(kind), fused_optimizer=OPTIMIZER), env=env, device=torch.device("cpu")
    )
    local = batch(kind, size=8, seed=env.rank)
    with torch.no_grad():
        sharded = dmp.module.prediction_model(local.dense_features, local.sparse_features)
        reference_logits = reference(local.dense_features, local.sparse_features)
    opt = torch.optim.Adagrad([p for n, p in dmp.named_parameters() if "embedding_bags" not in n], lr=0.05)
    losses = []
    for step in range(3):
        loss, (_, logits, _) = dmp(batch(kind, size=8, seed=10 * env.rank + step))
        assert logits.shape == (8,)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    result = {"same_logits": torch.allclose(sharded, reference_logits, atol=1e-5), "losses": losses}
    if kind == "two_tower":
        result["recall"] = evaluate_recall_at_k(dmp.module, [batch(kind, size=8, seed=env.rank)], k=2)
    last_dense = [p for n, p in dmp.named_parameters() if "embedding_bags" not in n][-1]
    result["dense"] = last_dense.detach().clone()
    return result


def _every_kind(env: ShardingEnv) -> dict:
    return {kind: _kind_under_dmp(kind, env) for kind in KINDS}


@pytest.mark.slow  # two spawned interpreters import torch and fbgemm
def test_every_kind_trains_under_dmp_on_two_ranks():
    results = run_multiprocess(_every_kind, 2)
    for kind in KINDS:
        for rank, result in enumerate(results):
            got = result[kind]
            assert got["same_logits"], f"{kind} rank {rank}: sharded logits differ from the unsharded model's"
            assert all(torch.isfinite(torch.tensor(got["losses"]))), got["losses"]
        # DDP averaged the dense gradients, so both ranks hold the same dense weights after training.
        torch.testing.assert_close(results[0][kind]["dense"], results[1][kind]["dense"])
    assert all(0.0 <= r["two_tower"]["recall"] <= 1.0 for r in results)
