"""EmbeddingCollection (sequence lookups) against one nn.Embedding per table; rows are copied, so exact."""

from __future__ import annotations

import pytest
import torch

from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig
from rectrain.errors import ConfigError
from tests.embedding.reference import ReferenceEC, fused_ec, random_batch, table_weights


def tables() -> list[EmbeddingConfig]:
    """Dims 8, 4, 8: two sequence TBEs, the first holding tables a and c (not adjacent in table order)."""
    return [
        EmbeddingConfig(name="a", num_embeddings=20, embedding_dim=8, feature_names=["x", "y"]),
        EmbeddingConfig(name="b", num_embeddings=10, embedding_dim=4, feature_names=["z"]),
        EmbeddingConfig(name="c", num_embeddings=30, embedding_dim=8, feature_names=["w"]),
    ]


ROWS = {"x": 20, "y": 20, "z": 10, "w": 30}


@pytest.mark.parametrize("batch_size", [1, 6])
def test_forward_matches_reference(batch_size: int) -> None:
    ec = fused_ec(tables())
    batch = random_batch({**ROWS, "extra": 5}, batch_size, torch.Generator().manual_seed(0))
    out = ec(batch.kjt(["w", "extra", "z", "y", "x"]))
    assert list(out) == ["x", "y", "z", "w"]
    expected = ReferenceEC(tables(), table_weights(ec, "embeddings", tables()))(batch)
    for (name, jagged), rows in zip(out.items(), expected):
        torch.testing.assert_close(jagged.values(), rows, rtol=0, atol=0)
        torch.testing.assert_close(jagged.lengths(), batch.lengths[name], rtol=0, atol=0)
        assert jagged.weights_or_none() is None


def test_need_indices_returns_ids_as_weights() -> None:
    ec = fused_ec(tables(), need_indices=True)
    assert ec.need_indices()
    batch = random_batch(ROWS, 4, torch.Generator().manual_seed(1))
    for name, jagged in ec(batch.kjt()).items():
        torch.testing.assert_close(jagged.weights(), batch.ids[name], rtol=0, atol=0)


def test_shared_feature_names_and_values() -> None:
    shared = [
        EmbeddingConfig(name="a", num_embeddings=10, embedding_dim=4, feature_names=["s"]),
        EmbeddingConfig(name="b", num_embeddings=10, embedding_dim=4, feature_names=["s", "t"]),
    ]
    ec = fused_ec(shared)
    assert ec.embedding_names_by_table() == [["s@a"], ["s@b", "t"]]
    batch = random_batch({"s": 10, "t": 10}, 3, torch.Generator().manual_seed(2))
    out = ec(batch.kjt())
    weights = table_weights(ec, "embeddings", shared)
    torch.testing.assert_close(out["s@a"].values(), weights["a"][batch.ids["s"]], rtol=0, atol=0)
    torch.testing.assert_close(out["s@b"].values(), weights["b"][batch.ids["s"]], rtol=0, atol=0)


def test_all_bags_empty() -> None:
    ec = fused_ec(tables())
    out = ec(random_batch(ROWS, 3, torch.Generator().manual_seed(3), max_len=0).kjt())
    assert out["z"].values().shape == (0, 4)
    assert out["x"].lengths().tolist() == [0, 0, 0]


def test_state_dict_keys_and_round_trip() -> None:
    source = fused_ec(tables())
    state = source.state_dict()
    assert sorted(state) == ["embeddings.a.weight", "embeddings.b.weight", "embeddings.c.weight"]
    target = fused_ec(tables())
    target.load_state_dict({k: v.clone() for k, v in state.items()})
    batch = random_batch(ROWS, 2, torch.Generator().manual_seed(4))
    for name, jagged in target(batch.kjt()).items():
        torch.testing.assert_close(jagged.values(), source(batch.kjt())[name].values(), rtol=0, atol=0)


def test_errors() -> None:
    with pytest.raises(ConfigError, match=r"tables\[0\] must be an EmbeddingConfig"):
        fused_ec([EmbeddingBagConfig(name="a", num_embeddings=4, embedding_dim=4)])
    ec = fused_ec(tables())
    batch = random_batch({"x": 20, "y": 20, "z": 10}, 2, torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="no feature 'w'"):
        ec(batch.kjt())
