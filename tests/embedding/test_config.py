import math

import pytest

from rectrain.embedding.config import (
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbOptimType,
    FusedOptimizerConfig,
    PoolingType,
)
from rectrain.errors import ConfigError


def test_defaults_follow_torchrec():
    cfg = EmbeddingBagConfig(num_embeddings=100, embedding_dim=8, name="t0", feature_names=["f0"])
    assert cfg.pooling is PoolingType.SUM
    assert cfg.data_type is DataType.FP32
    assert cfg.get_weight_init_max() == pytest.approx(math.sqrt(1 / 100))
    assert cfg.get_weight_init_min() == pytest.approx(-math.sqrt(1 / 100))


def test_feature_names_default_to_table_name():
    assert EmbeddingConfig(num_embeddings=10, embedding_dim=4, name="item").feature_names == ["item"]


def test_strings_coerce_to_enums():
    cfg = EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t", pooling="mean", data_type="fp16")
    assert cfg.pooling is PoolingType.MEAN and cfg.data_type is DataType.FP16
    assert FusedOptimizerConfig(optimizer="ADAM").optimizer is EmbOptimType.ADAM


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_embeddings": 0, "embedding_dim": 4}, "num_embeddings must be a positive int, got 0"),
        ({"num_embeddings": 10, "embedding_dim": -1}, "embedding_dim must be a positive int, got -1"),
        ({"num_embeddings": 10, "embedding_dim": 4, "feature_names": ["a", "a"]}, "duplicates"),
        (
            {"num_embeddings": 10, "embedding_dim": 4, "weight_init_min": 1.0, "weight_init_max": 0.5},
            "greater",
        ),
        ({"num_embeddings": 10, "embedding_dim": 4, "pooling": PoolingType.NONE}, "use EmbeddingConfig"),
    ],
)
def test_bad_table_config_names_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        EmbeddingBagConfig(name="t7", **kwargs)
    assert "t7" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_optimizer_config():
    with pytest.raises(ConfigError, match="optimizer must be one of sgd, adagrad, rowwise_adagrad, adam"):
        FusedOptimizerConfig(optimizer="lamb")
    with pytest.raises(ConfigError, match="lr must be >= 0"):
        FusedOptimizerConfig(lr=-1.0)
    with pytest.raises(ConfigError, match="beta1 and beta2"):
        FusedOptimizerConfig(beta1=1.0)


def test_optimizer_state_size_per_row():
    dims = 64
    sizes = {o: FusedOptimizerConfig(optimizer=o).state_floats_per_row(dims) for o in EmbOptimType}
    assert sizes == {
        EmbOptimType.SGD: 0,
        EmbOptimType.ADAGRAD: 64,
        EmbOptimType.ROWWISE_ADAGRAD: 1,
        EmbOptimType.ADAM: 128,
    }
