"""DLRM under DistributedModelParallel on 2 real gloo ranks: same logits as unsharded, and it learns."""

import pytest
import torch

from rectrain import EmbeddingBagCollection, FusedOptimizerConfig
from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.models import DLRM, DLRMTrain
from tests.distributed.multiprocess import run_multiprocess
from tests.models.test_dlrm import DENSE, D, _learnable_batch, kjt, tables


def _dlrm() -> DLRM:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables(rows=20), fused_optimizer=FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=0.1)
    )
    return DLRM(ebc, DENSE, [16, D], [16, 1])


def _sharded_vs_unsharded_then_train(env: ShardingEnv) -> dict:
    reference = _dlrm()
    dmp = DistributedModelParallel(DLRMTrain(_dlrm()), env=env, device=torch.device("cpu"))
    dense, features = torch.randn(8, DENSE), kjt(batch=8, rows=20, seed=env.rank)
    with torch.no_grad():
        sharded = dmp.module.model(dense, features)
        same_logits = torch.allclose(sharded, reference(dense, features), atol=1e-5)

    opt = torch.optim.Adagrad([p for n, p in dmp.named_parameters() if "sparse_arch" not in n], lr=0.05)
    losses = []
    for step in range(40):
        batch = _learnable_batch(100 * env.rank + step % 4, batch=128)
        loss, _ = dmp(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first_weight = next(p for n, p in dmp.named_parameters() if "sparse_arch" not in n)
    return {"same_logits": same_logits, "losses": losses, "dense_weight": first_weight.detach().clone()}


@pytest.mark.slow  # two spawned interpreters import torch and fbgemm
def test_dlrm_under_dmp_matches_unsharded_and_learns():
    results = run_multiprocess(_sharded_vs_unsharded_then_train, 2)
    for rank, result in enumerate(results):
        assert result["same_logits"], f"rank {rank}: sharded logits differ from the unsharded model's"
        losses = result["losses"]
        assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, f"rank {rank}: loss did not fall: {losses}"
    torch.testing.assert_close(results[0]["dense_weight"], results[1]["dense_weight"])  # DDP kept them equal
