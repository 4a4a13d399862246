"""The ranking stage: user features looked up once per request give the ranking package's own scores."""

from __future__ import annotations

import pytest
import torch

from recserve.recommend.ranking import Ranker, item_bags
from recserve.recommend.towers import bags_to_kjt, repeat_bags
from recserve.runtime.predictor import Predictor
from rectrain import EmbeddingBagConfig, PoolingType
from rectrain.models.config import ModelConfig
from tests.recommend.fixtures import GENRES, ITEMS, USERS, export_model


def _joined_scores(predictor: Predictor, users, dense, counts, items, item_dense):
    """What scoring the joined features directly gives: the user's bags repeated beside each candidate."""
    total = int(item_dense.shape[0])
    bags = {f: repeat_bags(*users[f], counts) for f in users}
    kjt = bags_to_kjt(predictor.metadata.feature_names, {**bags, **items}, total)
    joined = torch.cat([torch.repeat_interleave(dense, counts, dim=0), item_dense], dim=1)
    return predictor.predict(joined, kjt)


def _catalogue(rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (rows,), generator=g)  # empty genre bags too
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    features = {
        "item": (torch.arange(rows + 1), torch.randint(0, ITEMS, (rows,), generator=g)),
        "genre": (offsets, torch.randint(0, GENRES, (int(offsets[-1]),), generator=g)),
    }
    return features, torch.rand(rows, 1, generator=g)


def _ranking_case(predictor: Predictor, user_features: list[str], bag_sizes: list[int]):
    """Three users (bags of ``bag_sizes`` ids, an empty one included) with 5, 0 and 9 candidates."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor(bag_sizes)
    users = {f: (lengths, torch.randint(0, USERS, (int(lengths.sum()),), generator=g)) for f in user_features}
    dense = torch.randn(3, predictor.metadata.dense_in_features - 1, generator=g)
    counts = torch.tensor([5, 0, 9])
    features, item_dense = _catalogue(40, seed=4)
    rows = torch.randint(0, 40, (14,), generator=g)
    return users, dense, counts, item_bags(features, rows), item_dense[rows]


@pytest.mark.parametrize("traced", [True, False])
def test_scores_equal_the_package_on_the_joined_features(pipeline_dir, traced):
    predictor = Predictor.load(pipeline_dir / "ranking", verify=False)
    if not traced:
        predictor.graph = None  # a package served eagerly (compile_dense, or a model the tracer refuses)
    ranker = Ranker(predictor, ["user"], ["item", "genre"])
    case = _ranking_case(predictor, ["user"], [1, 2, 0])
    got = ranker.scores(*case)
    assert got.shape == (14,)
    assert torch.equal(got, _joined_scores(predictor, *case))


def test_user_columns_are_found_in_shared_and_mean_pooled_tables(tmp_path):
    # One table read by the user feature and by an item feature, a MEAN-pooled item table, and a second
    # user feature: the pooled columns the user side fills are the right ones, whatever the table layout.
    tables = [
        EmbeddingBagConfig(
            name="shared", num_embeddings=USERS, embedding_dim=8, feature_names=["item", "user"]
        ),
        EmbeddingBagConfig(
            name="genres", num_embeddings=GENRES, embedding_dim=8, feature_names=["genre"],
            pooling=PoolingType.MEAN,
        ),
        EmbeddingBagConfig(name="ctx", num_embeddings=USERS, embedding_dim=8, feature_names=["context"]),
    ]  # fmt: skip
    cfg = ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=3, dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
    )  # fmt: skip
    predictor = Predictor.load(export_model(tmp_path / "r", cfg, "r", seed=5), verify=False)
    ranker = Ranker(predictor, ["user", "context"], ["item", "genre"])
    users, dense, counts, items, item_dense = _ranking_case(predictor, ["user", "context"], [2, 1, 1])
    items["item"] = (items["item"][0], items["item"][1] % USERS)  # the shared table has USERS rows
    got = ranker.scores(users, dense, counts, items, item_dense)
    want = _joined_scores(predictor, users, dense, counts, items, item_dense)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_fixed_width_features_gather_the_same_bags_as_the_jagged_path():
    # Every bag of "item" holds one id, of "pair" two: gathered as rows of a 2-D view, the same ids in the
    # same order as the jagged gather; a feature left out of the widths still goes the jagged way.
    g = torch.Generator().manual_seed(6)
    features = {
        "item": (torch.arange(21), torch.randint(0, ITEMS, (20,), generator=g)),
        "pair": (torch.arange(21) * 2, torch.randint(0, GENRES, (40,), generator=g)),
        "genre": _catalogue(20, seed=7)[0]["genre"],
    }
    rows = torch.tensor([3, 0, 19, 3, 7])
    got = item_bags(features, rows, {"item": 1, "pair": 2})
    want = item_bags(features, rows)
    for f in features:
        assert torch.equal(got[f][0], want[f][0]) and torch.equal(got[f][1], want[f][1]), f
