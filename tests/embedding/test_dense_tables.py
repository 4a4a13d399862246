"""Collections built without ``fused_optimizer=`` behave as TorchRec's: tables are parameters with gradients
that the user's optimizer steps (Adam, weight decay, LR schedulers, apply_optimizer_in_backward)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from tests.embedding.reference import (
    ReferenceEBC,
    ReferenceEC,
    fused_ebc,
    random_batch,
    table_weights,
)


def _tables() -> list[EmbeddingBagConfig]:
    """Odd dims, SUM and MEAN, a table read by two features: nothing the fused kernels would need."""
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=50, embedding_dim=3, feature_names=["f0"]),
        EmbeddingBagConfig(
            name="t1",
            num_embeddings=30,
            embedding_dim=5,
            feature_names=["f1", "f2"],
            pooling=PoolingType.MEAN,
        ),
    ]


ROWS = {"f0": 50, "f1": 30, "f2": 30}


@pytest.mark.parametrize("weighted", [False, True])
def test_forward_matches_one_embedding_bag_per_table(weighted: bool) -> None:
    ebc = EmbeddingBagCollection(_tables(), is_weighted=weighted)
    batch = random_batch(ROWS, 6, torch.Generator().manual_seed(0), weighted=weighted)
    out = ebc(batch.kjt(["f2", "f0", "f1"]))
    assert out.keys() == ["f0", "f1", "f2"] and out.length_per_key() == [3, 5, 5]
    reference_tables = _tables() if not weighted else [_tables()[0]]
    reference = ReferenceEBC(reference_tables, table_weights(ebc, "embedding_bags", _tables()))
    expected = reference(batch)
    torch.testing.assert_close(out.values()[:, : expected.shape[1]], expected, rtol=1e-6, atol=1e-7)
    if weighted:  # weighted MEAN: the weighted sum over the bag length (torch pools weights only with SUM)
        lengths = batch.lengths["f1"].clamp(min=1).unsqueeze(1)
        bag = nn.EmbeddingBag.from_pretrained(ebc.embedding_bags["t1"].weight.detach(), mode="sum")
        offsets = batch.offsets("f1")[:-1]
        mean = bag(batch.ids["f1"], offsets, per_sample_weights=batch.weights["f1"]) / lengths
        torch.testing.assert_close(out["f1"], mean, rtol=1e-6, atol=1e-7)


def test_tables_are_parameters_with_gradients() -> None:
    ebc = EmbeddingBagCollection(_tables())
    names = [name for name, _ in ebc.named_parameters()]
    assert names == ["embedding_bags.t0.weight", "embedding_bags.t1.weight"]
    assert all(p.requires_grad for p in ebc.parameters())
    assert isinstance(ebc.embedding_bags["t0"], nn.EmbeddingBag)
    ebc(random_batch(ROWS, 4, torch.Generator().manual_seed(1)).kjt()).values().sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in ebc.parameters())
    assert ebc.fused_optimizer is None


def test_adam_with_weight_decay_and_step_lr_update_every_row() -> None:
    """The prediction example's pattern: Adam(weight_decay) and StepLR drive the tables, and the dense
    gradient with weight decay moves rows no batch read, as in TorchRec."""
    ebc = EmbeddingBagCollection(_tables())
    before = {k: v.detach().clone() for k, v in ebc.state_dict().items()}
    optimizer = torch.optim.Adam(ebc.parameters(), lr=0.01, weight_decay=1e-5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    batch = random_batch({"f0": 5, "f1": 5, "f2": 5}, 8, torch.Generator().manual_seed(2), empty_bags=False)
    for _ in range(3):
        optimizer.zero_grad()
        ebc(batch.kjt()).values().square().sum().backward()
        torch.nn.utils.clip_grad_norm_(ebc.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 / 8)
    after = ebc.state_dict()
    read, unread = after["embedding_bags.t0.weight"][:5], after["embedding_bags.t0.weight"][5:]
    assert not torch.equal(read, before["embedding_bags.t0.weight"][:5])
    assert not torch.equal(unread, before["embedding_bags.t0.weight"][5:])  # Adam's decay term


def test_apply_optimizer_in_backward_steps_the_tables() -> None:
    ebc = EmbeddingBagCollection(_tables())
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.5})
    before = ebc.embedding_bags["t0"].weight.detach().clone()
    ebc(
        random_batch(ROWS, 4, torch.Generator().manual_seed(3), empty_bags=False).kjt()
    ).values().sum().backward()
    assert not torch.equal(ebc.embedding_bags["t0"].weight, before)


def test_same_seed_gives_the_fused_collections_weights_and_outputs() -> None:
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=20, embedding_dim=8) for i in range(2)]
    torch.manual_seed(5)
    dense = EmbeddingBagCollection(tables)
    torch.manual_seed(5)
    fused = fused_ebc(tables)
    for key, value in dense.state_dict().items():
        assert torch.equal(value, fused.state_dict()[key])
    kjt = random_batch({"t0": 20, "t1": 20}, 5, torch.Generator().manual_seed(6)).kjt()
    torch.testing.assert_close(dense(kjt).values(), fused(kjt).values(), rtol=1e-5, atol=1e-6)


def test_moves_and_casts_like_any_module() -> None:
    ebc = EmbeddingBagCollection(_tables()).double()
    assert ebc.embedding_bags["t0"].weight.dtype == torch.float64
    out = ebc(random_batch(ROWS, 2, torch.Generator().manual_seed(7)).kjt())
    assert out.values().dtype == torch.float32  # TorchRec's forward returns float


def test_errors_name_the_feature() -> None:
    ebc = EmbeddingBagCollection(_tables())
    batch = random_batch(ROWS, 3, torch.Generator().manual_seed(8), empty_bags=False)
    with pytest.raises(ValueError, match="no feature 'f2'"):
        ebc(batch.kjt(["f0", "f1"]))
    batch.ids["f1"][0] = 30
    with pytest.raises(ValueError, match=r"feature 'f1': id 30 is out of range .*num_embeddings=30"):
        ebc(batch.kjt())
    with pytest.raises(ValueError, match="is_weighted"):
        EmbeddingBagCollection(_tables(), is_weighted=True)(batch.kjt())


@pytest.mark.parametrize("need_indices", [False, True])
def test_sequence_collection_matches_one_embedding_per_table(need_indices: bool) -> None:
    tables = [
        EmbeddingConfig(name="a", num_embeddings=20, embedding_dim=3, feature_names=["x", "y"]),
        EmbeddingConfig(name="b", num_embeddings=10, embedding_dim=6, feature_names=["z"]),
    ]
    ec = EmbeddingCollection(tables, need_indices=need_indices)
    assert all(p.requires_grad for p in ec.parameters())
    batch = random_batch({"x": 20, "y": 20, "z": 10}, 4, torch.Generator().manual_seed(9))
    out = ec(batch.kjt(["z", "x", "y"]))
    assert list(out) == ["x", "y", "z"]
    expected = ReferenceEC(tables, table_weights(ec, "embeddings", tables))(batch)
    for (name, jagged), rows in zip(out.items(), expected):
        torch.testing.assert_close(jagged.values(), rows, rtol=0, atol=0)
        assert torch.equal(jagged.lengths(), batch.lengths[name])
        assert (jagged.weights_or_none() is not None) == need_indices
    sum(jt.values().sum() for jt in out.values()).backward()
    assert ec.embeddings["a"].weight.grad is not None
