"""The fused embedding optimizer's TorchRec-style surface, and CombinedOptimizer over dense + fused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.optim import CombinedOptimizer, FusedEmbeddingOptimizer
from tests.embedding.reference import random_batch

TABLES = [
    EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=4),
    EmbeddingBagConfig(name="t1", num_embeddings=10, embedding_dim=8),
]
ROWS = {"t0": 20, "t1": 10}


class Model(nn.Module):
    def __init__(self, optimizer: str = "rowwise_adagrad", lr: float = 0.1) -> None:
        super().__init__()
        config = FusedOptimizerConfig(optimizer=optimizer, lr=lr)
        self.ebc = EmbeddingBagCollection(TABLES, fused_optimizer=config)
        self.linear = nn.Linear(12, 1)

    def forward(self, batch) -> torch.Tensor:
        return self.linear(self.ebc(batch.kjt()).values()).sum()


def train_step(model: Model, optimizer: torch.optim.Optimizer, seed: int) -> None:
    batch = random_batch(ROWS, 4, torch.Generator().manual_seed(seed), empty_bags=False)
    optimizer.zero_grad()
    model(batch).backward()
    optimizer.step()


def combined(model: Model) -> CombinedOptimizer:
    dense = torch.optim.Adagrad(model.linear.parameters(), lr=0.1)
    return CombinedOptimizer([("dense", dense), ("sparse", model.ebc.fused_optimizer)])


def test_fused_optimizer_is_keyed_with_readable_state_names() -> None:
    torch.manual_seed(0)
    model = Model("adagrad")
    fused = model.ebc.fused_optimizer
    assert isinstance(fused, FusedEmbeddingOptimizer)
    train_step(model, combined(model), seed=0)
    assert "param_groups" not in fused.state_dict()  # TorchRec saves them only when asked
    fused.save_param_groups(True)
    state = fused.state_dict()
    assert sorted(state["state"]) == ["embedding_bags.t0.weight", "embedding_bags.t1.weight"]
    assert sorted(state["state"]["embedding_bags.t1.weight"]) == ["t1.momentum1"]
    assert state["state"]["embedding_bags.t1.weight"]["t1.momentum1"].shape == (10, 8)
    assert state["param_groups"][0]["params"] == ["embedding_bags.t0.weight", "embedding_bags.t1.weight"]
    assert state["param_groups"][0]["lr"] == pytest.approx(0.1)


def test_adam_state_names() -> None:
    model = Model("adam")
    train_step(model, combined(model), seed=0)
    state = model.ebc.fused_optimizer.state_dict()["state"]["embedding_bags.t0.weight"]
    assert sorted(state) == ["t0.exp_avg", "t0.exp_avg_sq", "t0.step"]
    assert int(state["t0.step"]) == 1


def test_step_and_zero_grad_are_no_ops_for_embeddings() -> None:
    model = Model()
    before = copy.deepcopy(model.ebc.state_dict())
    model.ebc.fused_optimizer.step()
    model.ebc.fused_optimizer.zero_grad()
    for key, value in model.ebc.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_combined_optimizer_steps_zeroes_and_exposes_all_groups() -> None:
    torch.manual_seed(0)
    model = Model()
    optimizer = combined(model)
    assert len(optimizer.param_groups) == 2
    dense_before = model.linear.weight.detach().clone()
    table_before = model.ebc.embedding_bags["t0"].weight.detach().clone()
    train_step(model, optimizer, seed=1)
    assert not torch.equal(model.linear.weight, dense_before)
    assert not torch.equal(model.ebc.embedding_bags["t0"].weight, table_before)
    optimizer.zero_grad(set_to_none=True)
    assert model.linear.weight.grad is None


@pytest.mark.parametrize("kind", ["rowwise_adagrad", "adam"])
def test_combined_state_dict_round_trip_restores_state_and_training(kind: str) -> None:
    torch.manual_seed(0)
    model = Model(kind)
    optimizer = combined(model)
    for seed in range(3):
        train_step(model, optimizer, seed)
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(optimizer.state_dict())
    # One keyed state dict, TorchRec's: member name + "." + key (a plain torch member keyed by position).
    assert sorted(saved_opt["state"]) == [
        "dense.0.0",
        "dense.0.1",
        "sparse.embedding_bags.t0.weight",
        "sparse.embedding_bags.t1.weight",
    ]
    saved_t0 = saved_opt["state"]["sparse.embedding_bags.t0.weight"]
    first = "t0.momentum1" if kind == "rowwise_adagrad" else "t0.exp_avg_sq"
    assert saved_t0[first].abs().sum() > 0

    torch.manual_seed(1)
    restored = Model(kind)
    restored_opt = combined(restored)
    restored.load_state_dict(saved_model)
    restored_opt.load_state_dict(saved_opt)
    state = restored_opt.state_dict()["state"]["sparse.embedding_bags.t0.weight"]
    for name, value in saved_t0.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0)
    train_step(model, optimizer, seed=9)
    train_step(restored, restored_opt, seed=9)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam"])
def test_lr_change_takes_effect_in_the_kernel(optimizer: str) -> None:
    model = Model(optimizer)
    opt = combined(model)
    opt.param_groups[1]["lr"] = 0.0
    assert model.ebc.embedding_bags.batches[0].get_learning_rate() == 0.0
    before = model.ebc.embedding_bags["t0"].weight.detach().clone()
    train_step(model, opt, seed=2)
    torch.testing.assert_close(model.ebc.embedding_bags["t0"].weight, before, rtol=0, atol=0)
    opt.param_groups[1]["lr"] = 0.5
    train_step(model, opt, seed=2)
    assert not torch.equal(model.ebc.embedding_bags["t0"].weight, before)


def test_lr_scheduler_drives_both_members() -> None:
    model = Model(lr=0.1)
    opt = combined(model)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    assert all(group["initial_lr"] == pytest.approx(0.1) for group in opt.param_groups)
    train_step(model, opt, seed=3)
    scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.05])
    assert model.ebc.embedding_bags.batches[0].get_learning_rate() == pytest.approx(0.05)


def test_fixed_hyper_parameters_and_bad_members_raise() -> None:
    model = Model()
    with pytest.raises(ValueError, match="eps of a fused embedding optimizer is fixed"):
        model.ebc.fused_optimizer.param_groups[0]["eps"] = 0.1
    with pytest.raises(TypeError, match=r"optims\[0\] must be an optimizer or a \(name, optimizer\) pair"):
        CombinedOptimizer([("dense", model.linear)])
    dense = torch.optim.SGD(model.linear.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Duplicate param key a.0.0"):
        CombinedOptimizer([("a", dense), ("a", dense)])
    optimizer = combined(model)
    train_step(model, optimizer, seed=0)
    saved = optimizer.state_dict()
    del saved["state"]["sparse.embedding_bags.t1.weight"]
    with pytest.raises(ValueError, match="Different parameter count: 2 vs 1"):
        optimizer.load_state_dict(saved)
