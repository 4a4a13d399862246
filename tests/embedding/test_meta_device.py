"""Collections on the meta device (described, not allocated), moves with ``.to()`` / ``.to_empty()``, and
initial values that depend only on (seed, table, row)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig, FusedOptimizerConfig, PoolingType
from rectrain.embedding.init import ROW_BLOCK, fill_rows
from rectrain.sparse import KeyedJaggedTensor
from tests.embedding.reference import random_batch


def tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=50, embedding_dim=3, feature_names=["f0", "f1"]),
        EmbeddingBagConfig(name="t1", num_embeddings=30, embedding_dim=8, pooling=PoolingType.MEAN),
    ]


# Both kinds of collection: fused (FBGEMM kernels, ``fused_optimizer=``) and TorchRec's (``nn.EmbeddingBag``).
KINDS = pytest.mark.parametrize("fused", [FusedOptimizerConfig(), None], ids=["fused", "torchrec"])


@KINDS
def test_meta_collection_allocates_nothing_and_forwards_shapes(fused: FusedOptimizerConfig | None) -> None:
    ebc = EmbeddingBagCollection(
        tables(), is_weighted=True, device=torch.device("meta"), fused_optimizer=fused
    )
    assert ebc.device == torch.device("meta")
    assert all(p.is_meta for p in ebc.parameters())
    if fused is not None:
        assert ebc.embedding_bags.batches == []
    kjt = KeyedJaggedTensor.from_offsets_sync(
        keys=["f0", "f1", "t1"],
        values=torch.tensor([1, 2, 4, 5, 4, 3], device="meta"),
        offsets=torch.tensor([0, 2, 2, 3, 4, 5, 6], device="meta"),
        weights=torch.ones(6, device="meta"),
    )
    out = ebc(kjt)
    assert out.values().shape == (2, 14) and out.values().is_meta
    assert out.keys() == ["f0", "f1", "t1"]


@KINDS
def test_default_device_follows_the_device_context(fused: FusedOptimizerConfig | None) -> None:
    with torch.device("meta"):
        ebc = EmbeddingBagCollection(tables(), fused_optimizer=fused)
        ec = EmbeddingCollection(
            [EmbeddingConfig(name="s", num_embeddings=5, embedding_dim=4)], fused_optimizer=fused
        )
    assert ebc.device == torch.device("meta") and ebc.embedding_bags["t0"].weight.is_meta
    assert ec.device == torch.device("meta") and ec.embeddings["s"].weight.is_meta
    assert EmbeddingBagCollection(tables(), fused_optimizer=fused).device == torch.device("cpu")


@KINDS
def test_to_empty_and_reset_give_the_values_built_directly(fused: FusedOptimizerConfig | None) -> None:
    torch.manual_seed(7)
    direct = EmbeddingBagCollection(tables(), fused_optimizer=fused)
    torch.manual_seed(7)
    described = EmbeddingBagCollection(tables(), device="meta", fused_optimizer=fused)
    described.to_empty(device="cpu")
    described.reset_parameters()
    for key, value in direct.state_dict().items():
        assert torch.equal(described.state_dict()[key], value), key
    batch = random_batch({"f0": 50, "f1": 50, "t1": 30}, 4, torch.Generator().manual_seed(1))
    assert torch.equal(described(batch.kjt()).values(), direct(batch.kjt()).values())


def test_moving_to_meta_and_back_keeps_training() -> None:
    ebc = EmbeddingBagCollection(tables(), fused_optimizer=FusedOptimizerConfig())
    ebc.to("meta")
    assert ebc.device.type == "meta" and ebc.embedding_bags.batches == []
    ebc.to_empty(device="cpu")
    ebc.reset_parameters()
    batch = random_batch({"f0": 50, "f1": 50, "t1": 30}, 4, torch.Generator().manual_seed(2))
    before = ebc.embedding_bags["t1"].weight.clone()
    ebc(batch.kjt()).values().sum().backward()
    assert not torch.equal(before, ebc.embedding_bags["t1"].weight), "the rebuilt kernel trains"
    assert len(ebc.fused_optimizer.state_dict()["state"]) == 2


def test_moving_a_torchrec_collection_to_meta_and_back_keeps_training() -> None:
    ebc = EmbeddingBagCollection(tables())
    ebc.to("meta")
    assert ebc.device.type == "meta" and ebc.embedding_bags["t1"].weight.is_meta
    ebc.to_empty(device="cpu")
    ebc.reset_parameters()
    batch = random_batch({"f0": 50, "f1": 50, "t1": 30}, 4, torch.Generator().manual_seed(2))
    ebc(batch.kjt()).values().sum().backward()
    assert ebc.embedding_bags["t1"].weight.grad is not None, "the user's optimizer steps the tables"


@KINDS
def test_one_seed_gives_the_same_tables_fused_or_not(fused: FusedOptimizerConfig | None) -> None:
    torch.manual_seed(11)
    reference = EmbeddingBagCollection(tables(), fused_optimizer=FusedOptimizerConfig())
    torch.manual_seed(11)
    ebc = EmbeddingBagCollection(tables(), fused_optimizer=fused)
    for key, value in reference.state_dict().items():
        assert torch.equal(ebc.state_dict()[key], value), key
    torch.manual_seed(11)
    reference_ec = EmbeddingCollection([EmbeddingConfig(name="s", num_embeddings=5000, embedding_dim=4)])
    torch.manual_seed(11)
    ec = EmbeddingCollection(
        [EmbeddingConfig(name="s", num_embeddings=5000, embedding_dim=4)], fused_optimizer=fused
    )
    assert torch.equal(ec.embeddings["s"].weight, reference_ec.embeddings["s"].weight)


@KINDS
def test_init_fn_and_bounds_are_honoured(fused: FusedOptimizerConfig | None) -> None:
    normal = EmbeddingBagConfig(
        name="n", num_embeddings=2000, embedding_dim=4, init_fn=partial(torch.nn.init.normal_, std=2.0)
    )
    bounded = EmbeddingBagConfig(
        name="b", num_embeddings=100, embedding_dim=4, weight_init_min=1.0, weight_init_max=1.5
    )
    ebc = EmbeddingBagCollection([normal, bounded], fused_optimizer=fused)
    n = ebc.embedding_bags["n"].weight
    assert 1.8 < float(n.std()) < 2.2
    b = ebc.embedding_bags["b"].weight
    assert float(b.min()) >= 1.0 and float(b.max()) <= 1.5


def test_init_values_depend_only_on_seed_table_and_row() -> None:
    table = EmbeddingBagConfig(name="t", num_embeddings=ROW_BLOCK * 2 + 7, embedding_dim=8)
    whole = torch.empty(table.num_embeddings, 8)
    fill_rows(whole, table, seed=3)
    piece = torch.empty(ROW_BLOCK, 4)
    fill_rows(piece, table, seed=3, row_offset=ROW_BLOCK // 2, col_offset=4)
    assert torch.equal(piece, whole[ROW_BLOCK // 2 : ROW_BLOCK // 2 + ROW_BLOCK, 4:])
    other = torch.empty(table.num_embeddings, 8)
    fill_rows(other, EmbeddingBagConfig(name="u", num_embeddings=table.num_embeddings, embedding_dim=8), 3)
    assert not torch.equal(other, whole)
    # The default generator is left where it was (init_fn draws from it inside a fork).
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    fill_rows(torch.empty(10, 4), EmbeddingBagConfig(10, 4, "i", init_fn=torch.nn.init.normal_), seed=1)
    assert torch.equal(torch.rand(3), expected)
