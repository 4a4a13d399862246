"""EmbeddingBagCollection forward against one nn.EmbeddingBag per table (fp32; asserted to rtol 1e-5, atol
1e-6: FBGEMM sums a bag's rows in a different order than nn.EmbeddingBag)."""

from __future__ import annotations

import copy

import pytest
import torch

from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig, PoolingType
from rectrain.errors import ConfigError
from tests.embedding.reference import ReferenceEBC, fused_ebc, random_batch, table_weights

RTOL, ATOL = 1e-5, 1e-6


def tables_mixed() -> list[EmbeddingBagConfig]:
    """SUM and MEAN interleaved (two TBEs whose outputs must be re-ordered), one table read by 2 features."""
    return [
        EmbeddingBagConfig(name="t0", num_embeddings=50, embedding_dim=8, feature_names=["f0"]),
        EmbeddingBagConfig(
            name="t1",
            num_embeddings=30,
            embedding_dim=4,
            feature_names=["f1", "f2"],
            pooling=PoolingType.MEAN,
        ),
        EmbeddingBagConfig(name="t2", num_embeddings=20, embedding_dim=16, feature_names=["f3"]),
    ]


def rows_of(tables: list[EmbeddingBagConfig]) -> dict[str, int]:
    return {f: t.num_embeddings for t in tables for f in t.feature_names}


def check_forward(ebc: EmbeddingBagCollection, batch, keys: list[str] | None = None) -> None:
    tables = ebc.embedding_bag_configs()
    reference = ReferenceEBC(tables, table_weights(ebc, "embedding_bags", tables))
    out = ebc(batch.kjt(keys))
    expected = reference(batch)
    assert out.values().shape == expected.shape
    torch.testing.assert_close(out.values(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("batch_size", [1, 7])
def test_forward_matches_reference_sum_and_mean_with_empty_bags(batch_size: int) -> None:
    torch.manual_seed(0)
    ebc = fused_ebc(tables_mixed())
    batch = random_batch(rows_of(tables_mixed()), batch_size, torch.Generator().manual_seed(1))
    check_forward(ebc, batch)
    out = ebc(batch.kjt())
    assert out.keys() == ["f0", "f1", "f2", "f3"]
    assert out.length_per_key() == [8, 4, 4, 16]


def test_forward_under_inference_mode_equals_the_training_forward() -> None:
    torch.manual_seed(0)
    ebc = fused_ebc(tables_mixed())
    kjt = random_batch(rows_of(tables_mixed()), 5, torch.Generator().manual_seed(4)).kjt()
    expected = ebc(kjt).values().detach()
    with torch.inference_mode():
        out = ebc(kjt).values()
    assert torch.equal(out, expected)


def test_forward_with_all_bags_empty_is_zero() -> None:
    ebc = fused_ebc(tables_mixed())
    batch = random_batch(rows_of(tables_mixed()), 3, torch.Generator().manual_seed(2), max_len=0)
    out = ebc(batch.kjt()).values()
    assert out.shape == (3, 32)
    assert torch.count_nonzero(out) == 0


def test_weighted_forward_matches_reference() -> None:
    tables = [
        EmbeddingBagConfig(name="a", num_embeddings=40, embedding_dim=8),
        EmbeddingBagConfig(name="b", num_embeddings=10, embedding_dim=4, feature_names=["b", "c"]),
    ]
    ebc = fused_ebc(tables, is_weighted=True)
    assert ebc.is_weighted()
    batch = random_batch(rows_of(tables), 6, torch.Generator().manual_seed(3), weighted=True)
    check_forward(ebc, batch)


def test_weighted_collection_needs_weights() -> None:
    tables = [EmbeddingBagConfig(name="a", num_embeddings=4, embedding_dim=4)]
    ebc = fused_ebc(tables, is_weighted=True)
    batch = random_batch(rows_of(tables), 2, torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="is_weighted"):
        ebc(batch.kjt())


def test_feature_shared_by_two_tables_gets_torchrec_names() -> None:
    tables = [
        EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["shared", "x"]),
        EmbeddingBagConfig(name="t1", num_embeddings=10, embedding_dim=8, feature_names=["shared"]),
    ]
    ebc = fused_ebc(tables)
    batch = random_batch({"shared": 10, "x": 10}, 5, torch.Generator().manual_seed(4))
    check_forward(ebc, batch)
    assert ebc(batch.kjt()).keys() == ["shared@t0", "x", "shared@t1"]


def test_permuted_and_extra_keys() -> None:
    tables = tables_mixed()
    ebc = fused_ebc(tables)
    rows = {**rows_of(tables), "unused": 100}
    batch = random_batch(rows, 4, torch.Generator().manual_seed(5))
    expected = ebc(batch.kjt(["f0", "f1", "f2", "f3"])).values()
    for keys in (["unused", "f3", "f1", "f0", "f2"], ["f2", "f3", "f0", "unused", "f1"]):
        check_forward(ebc, batch, keys)
        torch.testing.assert_close(ebc(batch.kjt(keys)).values(), expected, rtol=0, atol=0)


def test_missing_feature_is_named() -> None:
    tables = tables_mixed()
    ebc = fused_ebc(tables)
    batch = random_batch(rows_of(tables), 2, torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match="no feature 'f2'"):
        ebc(batch.kjt(["f0", "f1", "f3"]))


def test_id_out_of_range_is_named() -> None:
    tables = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f", "g"])]
    ebc = fused_ebc(tables)
    batch = random_batch({"f": 10, "g": 10}, 3, torch.Generator().manual_seed(7), empty_bags=False)
    batch.ids["g"][0] = 10
    with pytest.raises(ValueError, match=r"feature 'g': id 10 is out of range .*num_embeddings=10"):
        ebc(batch.kjt())


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ([], "tables is empty"),
        (
            [
                EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4),
                EmbeddingBagConfig(name="t", num_embeddings=5, embedding_dim=4, feature_names=["g"]),
            ],
            "duplicate table name 't'",
        ),
        ([EmbeddingBagConfig(num_embeddings=4, embedding_dim=4, feature_names=["f"])], "has no name"),
    ],
)
def test_bad_tables_raise_config_error(tables: list[EmbeddingBagConfig], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        fused_ebc(tables)


def test_init_is_reproducible_and_within_bounds() -> None:
    tables = [
        EmbeddingBagConfig(
            name="a", num_embeddings=100, embedding_dim=8, weight_init_min=0.5, weight_init_max=0.75
        ),
        EmbeddingBagConfig(name="b", num_embeddings=100, embedding_dim=8, pooling=PoolingType.MEAN),
    ]
    torch.manual_seed(42)
    first = {k: v.clone() for k, v in fused_ebc(tables).state_dict().items()}
    torch.manual_seed(42)
    second = fused_ebc(tables).state_dict()
    for key, value in first.items():
        torch.testing.assert_close(second[key], value, rtol=0, atol=0)
    a = first["embedding_bags.a.weight"]
    assert a.min() >= 0.5 and a.max() <= 0.75
    bound = (1 / 100) ** 0.5
    assert first["embedding_bags.b.weight"].abs().max() <= bound


def test_state_dict_round_trip() -> None:
    tables = tables_mixed()
    source = fused_ebc(tables)
    state = source.state_dict()
    assert sorted(state) == [f"embedding_bags.{t}.weight" for t in ("t0", "t1", "t2")]
    assert state["embedding_bags.t1.weight"].shape == (30, 4)
    target = fused_ebc(tables)
    target.load_state_dict({k: v.clone() for k, v in state.items()})
    batch = random_batch(rows_of(tables), 5, torch.Generator().manual_seed(8))
    torch.testing.assert_close(target(batch.kjt()).values(), source(batch.kjt()).values(), rtol=0, atol=0)


def test_load_state_dict_writes_into_kernel_storage() -> None:
    tables = [EmbeddingBagConfig(name="t", num_embeddings=6, embedding_dim=4)]
    ebc = fused_ebc(tables)
    ebc.load_state_dict({"embedding_bags.t.weight": torch.arange(24.0).view(6, 4)})
    batch = random_batch({"t": 6}, 2, torch.Generator().manual_seed(9), empty_bags=False)
    batch.ids["t"][:] = 5
    out = ebc(batch.kjt()).values()
    torch.testing.assert_close(out, batch.lengths["t"].float().unsqueeze(1) * torch.arange(20.0, 24.0))


def test_deepcopy_is_independent() -> None:
    tables = tables_mixed()
    ebc = fused_ebc(tables)
    clone = copy.deepcopy(ebc)
    with torch.no_grad():
        clone.embedding_bags["t0"].weight.fill_(1.0)
    batch = random_batch(rows_of(tables), 3, torch.Generator().manual_seed(10), empty_bags=False)
    assert torch.all(clone(batch.kjt()).values()[:, :8] != ebc(batch.kjt()).values()[:, :8])


def test_casting_after_construction_raises() -> None:
    ebc = fused_ebc(tables_mixed())
    with pytest.raises(ValueError, match="cannot be cast to another dtype"):
        ebc.double()


def test_dims_that_are_not_multiples_of_4_match_reference() -> None:
    """FBGEMM's kernels take multiples of 4: the tables are padded inside the kernel, invisibly."""
    tables = [
        EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=3, feature_names=["f0", "f1"]),
        EmbeddingBagConfig(name="t1", num_embeddings=15, embedding_dim=6, pooling=PoolingType.MEAN),
        EmbeddingBagConfig(name="t2", num_embeddings=12, embedding_dim=1, feature_names=["f2"]),
    ]
    ebc = EmbeddingBagCollection(tables)
    assert ebc.embedding_bags["t0"].weight.shape == (20, 3)
    check_forward(ebc, random_batch(rows_of(tables), 7, torch.Generator().manual_seed(3)))


@pytest.mark.gpu
def test_cuda_forward_matches_cpu() -> None:
    tables = tables_mixed()
    torch.manual_seed(0)
    cpu = fused_ebc(tables)
    torch.manual_seed(0)
    cuda = fused_ebc(tables, device="cuda")
    assert cuda.device.type == "cuda"
    batch = random_batch(rows_of(tables), 16, torch.Generator().manual_seed(11))
    kjt = batch.kjt()
    cuda_kjt = type(kjt)(
        keys=kjt.keys(), values=kjt.values().cuda(), lengths=kjt.lengths().cuda(), weights=None
    )
    torch.testing.assert_close(cuda(cuda_kjt).values().cpu(), cpu(kjt).values(), rtol=RTOL, atol=ATOL)
