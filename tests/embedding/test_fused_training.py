"""Five training steps with each fused optimizer against nn.EmbeddingBag / nn.Embedding (sparse=True) and the
matching torch.optim optimizer (row-wise Adagrad: a reference formula).

Semantics matched: Adagrad with initial_accumulator_value=0, eps added after the square root (FBGEMM and
torch.optim.Adagrad agree); row-wise Adagrad keeps one accumulator per row, the mean of the squared row
gradient; Adam is torch.optim.SparseAdam (every table steps every batch). Tolerance: fp32, only summation
order differs, so weights and optimizer state are asserted to rtol 1e-5, atol 1e-6.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig, PoolingType
from tests.embedding.reference import ReferenceEBC, ReferenceEC, random_batch, table_weights

RTOL, ATOL = 1e-5, 1e-6
LR, EPS, STEPS = 0.1, 1e-8, 5


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad on sparse grads: acc[r] += mean(g[r]^2); w[r] -= lr * g[r] / (sqrt(acc[r]) + eps)."""

    def __init__(self, params: list[Tensor], lr: float, eps: float) -> None:
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for param in group["params"]:
                grad = param.grad.coalesce()
                rows, values = grad.indices()[0], grad.values()
                acc = self.state[param].setdefault("momentum1", torch.zeros(param.shape[0]))
                acc.index_add_(0, rows, values.pow(2).mean(dim=1))
                denom = acc.index_select(0, rows).sqrt().add_(group["eps"]).unsqueeze(1)
                param.index_add_(0, rows, values / denom, alpha=-group["lr"])


def reference_optimizer(name: str, params: list[Tensor]) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=LR, eps=EPS, initial_accumulator_value=0.0)
    if name == "rowwise_adagrad":
        return RowWiseAdagrad(params, lr=LR, eps=EPS)
    return torch.optim.SparseAdam(params, lr=LR, eps=EPS)


def loss_of(out: Tensor, target: Tensor) -> Tensor:
    return ((out - target) ** 2).sum()


EBC_TABLES = [
    EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=8, feature_names=["f0", "f1"]),
    EmbeddingBagConfig(name="t1", num_embeddings=15, embedding_dim=4, pooling=PoolingType.MEAN),
    EmbeddingBagConfig(name="t2", num_embeddings=12, embedding_dim=16, feature_names=["f0"]),
]
EBC_ROWS = {"f0": 12, "f1": 20, "t1": 15}  # f0 is read by t0 (20 rows) and t2 (12 rows): ids < 12


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("weighted", [False, True])
def test_ebc_training_matches_torch_optim(optimizer: str, weighted: bool) -> None:
    tables = EBC_TABLES if not weighted else [t for t in EBC_TABLES if t.pooling == PoolingType.SUM]
    rows = EBC_ROWS if not weighted else {"f0": 12, "f1": 20}
    torch.manual_seed(0)
    config = FusedOptimizerConfig(optimizer=optimizer, lr=LR, eps=EPS)
    ebc = EmbeddingBagCollection(tables, is_weighted=weighted, fused_optimizer=config)
    reference = ReferenceEBC(
        tables, {k: v.clone() for k, v in table_weights(ebc, "embedding_bags", tables).items()}
    )
    batches = [
        random_batch(rows, 6, torch.Generator().manual_seed(s), weighted=weighted) for s in range(STEPS)
    ]
    ref_opt = reference_optimizer(optimizer, list(reference.bags.parameters()))
    for step, batch in enumerate(batches):
        out = ebc(batch.kjt()).values()
        target = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + step))
        loss_of(out, target).backward()
        ref_opt.zero_grad()
        loss_of(reference(batch), target).backward()
        ref_opt.step()
    assert all(p.grad is None for p in ebc.parameters()), "fused training must not materialise gradients"
    state = ebc.fused_optimizer.state_dict()["state"]
    for table in tables:
        ref_weight = reference.bags[table.name].weight
        torch.testing.assert_close(
            ebc.embedding_bags[table.name].weight, ref_weight.detach(), rtol=RTOL, atol=ATOL
        )
        check_table_state(
            optimizer,
            table.name,
            state.get(f"embedding_bags.{table.name}.weight", {}),
            ref_opt.state[ref_weight],
        )


def check_table_state(optimizer: str, table: str, ours: dict[str, Tensor], ref: dict[str, Tensor]) -> None:
    """Our per-table optimizer state against the reference optimizer's state of that table's weight."""
    if optimizer == "sgd":
        assert ours == {}
    elif optimizer in ("adagrad", "rowwise_adagrad"):
        ref_name = "sum" if optimizer == "adagrad" else "momentum1"
        torch.testing.assert_close(ours[f"{table}.momentum1"], ref[ref_name], rtol=RTOL, atol=ATOL)
    else:
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours[f"{table}.{name}"], ref[name], rtol=RTOL, atol=ATOL)
        assert int(ours[f"{table}.step"]) == int(ref["step"]) == STEPS


ODD_TABLES = [
    EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=3, feature_names=["f0", "f1"]),
    EmbeddingBagConfig(name="t1", num_embeddings=15, embedding_dim=6, pooling=PoolingType.MEAN),
]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_padded_dims_train_like_torch_optim(optimizer: str) -> None:
    """Tables whose dim is not a multiple of 4 (padded inside the kernel) train as unpadded ones.

    Row-wise Adagrad is left out: its accumulator is the mean over the kernel's padded width (README)."""
    torch.manual_seed(0)
    config = FusedOptimizerConfig(optimizer=optimizer, lr=LR, eps=EPS)
    ebc = EmbeddingBagCollection(ODD_TABLES, fused_optimizer=config)
    reference = ReferenceEBC(
        ODD_TABLES, {k: v.clone() for k, v in table_weights(ebc, "embedding_bags", ODD_TABLES).items()}
    )
    ref_opt = reference_optimizer(optimizer, list(reference.bags.parameters()))
    for step in range(STEPS):
        batch = random_batch({"f0": 20, "f1": 20, "t1": 15}, 6, torch.Generator().manual_seed(step))
        out = ebc(batch.kjt()).values()
        target = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + step))
        loss_of(out, target).backward()
        ref_opt.zero_grad()
        loss_of(reference(batch), target).backward()
        ref_opt.step()
    state = ebc.fused_optimizer.state_dict()["state"]
    for table in ODD_TABLES:
        ref_weight = reference.bags[table.name].weight
        torch.testing.assert_close(
            ebc.embedding_bags[table.name].weight, ref_weight.detach(), rtol=RTOL, atol=ATOL
        )
        ours = state.get(f"embedding_bags.{table.name}.weight", {})
        check_table_state(optimizer, table.name, ours, ref_opt.state[ref_weight])


EC_TABLES = [
    EmbeddingConfig(name="a", num_embeddings=20, embedding_dim=8, feature_names=["x", "y"]),
    EmbeddingConfig(name="b", num_embeddings=10, embedding_dim=4, feature_names=["z"]),
    EmbeddingConfig(name="c", num_embeddings=30, embedding_dim=8, feature_names=["w"]),
]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_ec_training_matches_torch_optim(optimizer: str) -> None:
    rows = {"x": 20, "y": 20, "z": 10, "w": 30}
    torch.manual_seed(0)
    config = FusedOptimizerConfig(optimizer=optimizer, lr=LR, eps=EPS)
    ec = EmbeddingCollection(EC_TABLES, fused_optimizer=config)
    reference = ReferenceEC(
        EC_TABLES, {k: v.clone() for k, v in table_weights(ec, "embeddings", EC_TABLES).items()}
    )
    ref_opt = reference_optimizer(optimizer, list(reference.embeddings.parameters()))
    for step in range(STEPS):
        batch = random_batch(rows, 5, torch.Generator().manual_seed(step))
        out = torch.cat([jt.values().flatten() for jt in ec(batch.kjt()).values()])
        target = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + step))
        loss_of(out, target).backward()
        ref_opt.zero_grad()
        loss_of(torch.cat([v.flatten() for v in reference(batch)]), target).backward()
        ref_opt.step()
    state = ec.fused_optimizer.state_dict()["state"]
    for table in EC_TABLES:
        ref_weight = reference.embeddings[table.name].weight
        torch.testing.assert_close(
            ec.embeddings[table.name].weight, ref_weight.detach(), rtol=RTOL, atol=ATOL
        )
        check_table_state(
            optimizer, table.name, state.get(f"embeddings.{table.name}.weight", {}), ref_opt.state[ref_weight]
        )


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_cuda_training_matches_cpu(optimizer: str) -> None:
    """FBGEMM's CUDA kernels (Adam included) against our CPU path; FBGEMM's Adam adds eps to the
    bias-corrected root (SparseAdam to the raw one), hence the looser tolerance."""
    tables = [t for t in EBC_TABLES if t.pooling == PoolingType.SUM]
    config = FusedOptimizerConfig(optimizer=optimizer, lr=LR, eps=EPS)
    torch.manual_seed(0)
    cpu = EmbeddingBagCollection(tables, fused_optimizer=config)
    torch.manual_seed(0)
    cuda = EmbeddingBagCollection(tables, device="cuda", fused_optimizer=config)
    for step in range(STEPS):
        kjt = random_batch({"f0": 12, "f1": 20}, 6, torch.Generator().manual_seed(step)).kjt()
        cuda_kjt = type(kjt)(keys=kjt.keys(), values=kjt.values().cuda(), lengths=kjt.lengths().cuda())
        out = cpu(kjt).values()
        target = torch.randn(out.shape, generator=torch.Generator().manual_seed(100 + step))
        loss_of(out, target).backward()
        loss_of(cuda(cuda_kjt).values(), target.cuda()).backward()
    for key, value in cpu.state_dict().items():
        torch.testing.assert_close(cuda.state_dict()[key].cpu(), value, rtol=1e-4, atol=1e-5)
