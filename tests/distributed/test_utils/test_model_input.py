import pytest
import torch

from rectrain.distributed.test_utils.model_input import ModelInput, VariableBatchModelInput
from rectrain.embedding.config import EmbeddingBagConfig

TABLES = [
    EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=50, feature_names=["f0", "f1"]),
    EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=7, feature_names=["f2"]),
]


def test_the_global_batch_is_the_local_batches_rank_after_rank():
    torch.manual_seed(0)
    glob, local = ModelInput.generate_global_and_local_batches(
        world_size=3, batch_size=4, tables=TABLES, weighted_tables=TABLES[1:], num_float_features=5
    )
    assert len(local) == 3 and glob.float_features.shape == (12, 5)
    assert torch.equal(glob.float_features, torch.cat([b.float_features for b in local]))
    assert torch.equal(glob.label, torch.cat([b.label for b in local]))
    for key in ("f0", "f1", "f2"):
        joined = torch.cat([b.idlist_features[key].values() for b in local])
        assert torch.equal(glob.idlist_features[key].values(), joined)
    assert glob.idscore_features.keys() == ["f2"] and glob.idscore_features.weights().numel() > 0


def test_lengths_respect_the_cap_and_ids_the_table():
    batch = ModelInput.generate(batch_size=64, tables=TABLES, pooling_avg=20, max_feature_lengths=[3, 5])
    kjt = batch.idlist_features
    assert batch.idscore_features is None
    assert int(kjt["f0"].lengths().max()) <= 3 and int(kjt["f2"].lengths().min()) >= 1
    assert int(kjt["f2"].values().max()) < 7


@pytest.mark.parametrize("alpha", [0.5, 1.0, 1.1, 1.5])
def test_power_law_ids_stay_in_the_table_and_favour_low_ids(alpha):
    torch.manual_seed(1)
    ids = ModelInput._generate_power_law_indices(alpha, 20000, 1000, torch.int32, None)
    assert ids.dtype == torch.int32 and int(ids.min()) >= 0 and int(ids.max()) < 1000
    assert float((ids < 100).float().mean()) > 0.15  # uniform would give 0.10


def test_power_law_refuses_a_negative_alpha():
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        ModelInput._generate_power_law_indices(-1.0, 5, 10, torch.int64, None)


def test_variable_batch_features_expand_to_the_full_batch():
    batch = VariableBatchModelInput.generate(batch_size=4, dedup_factor=2, tables=TABLES)
    kjt = batch.idlist_features
    keys, inverse = kjt.inverse_indices()
    assert keys == ["f0", "f1", "f2"] and inverse.shape == (3, 8)
    assert batch.float_features.shape[0] == 8
    assert batch.size_in_bytes() > batch.float_features.numel() * 4
