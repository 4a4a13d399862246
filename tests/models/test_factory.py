"""build_model / build_train_model: every kind builds, gives 1-D logits, keeps the agreed keys, trains."""

import pytest
import torch

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.models import (
    DLRM,
    DLRM_DCN,
    PREDICTION_PREFIX,
    Batch,
    DLRMPrediction,
    DLRMTrain,
    ModelConfig,
    TwoTower,
    TwoTowerPrediction,
    TwoTowerTrainTask,
    build_model,
    build_train_model,
)
from tests.models.test_dlrm import kjt

DENSE, DIM, ROWS = 5, 8, 40
EBC_PATHS = {
    "dlrm": "sparse_arch.embedding_bag_collection",
    "dlrm_dcn": "sparse_arch.embedding_bag_collection",
}
EBC_PATHS["two_tower"] = "ebc"


def config(kind: str) -> ModelConfig:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f{i}"])
        for i in range(2 if kind == "two_tower" else 3)
    ]
    if kind == "two_tower":
        return ModelConfig(kind=kind, tables=tables, dense_in_features=0, tower_layer_sizes=[16, 8])
    return ModelConfig(
        kind=kind,
        tables=tables,
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[16, DIM],
        over_arch_layer_sizes=[8, 1],
        dcn_num_layers=2,
        dcn_low_rank_dim=4,
    )


def batch(kind: str, size: int = 6, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    width = 0 if kind == "two_tower" else DENSE
    num_features = 2 if kind == "two_tower" else 3
    labels = torch.randint(0, 2, (size,), generator=g).float()
    labels[0] = 1.0  # at least one positive pair for the two-tower softmax
    return Batch(torch.randn(size, width, generator=g), kjt(size, num_features, ROWS, seed), labels)


KINDS = ["dlrm", "dlrm_dcn", "two_tower"]
ARCHS = {"dlrm": DLRM, "dlrm_dcn": DLRM_DCN, "two_tower": TwoTower}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [1, 6])
def test_prediction_module_gives_one_logit_per_example(kind, size):
    model = build_model(config(kind))
    b = batch(kind, size)
    logits = model(b.dense_features, b.sparse_features)
    assert logits.shape == (size,) and logits.dtype == torch.float32
    assert isinstance(model.model, ARCHS[kind])
    assert sum(isinstance(m, EmbeddingBagCollection) for m in model.modules()) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_keys_are_prefix_plus_torchrec_names(kind):
    model = build_model(config(kind))
    keys = list(model.state_dict())
    assert all(k.startswith(PREDICTION_PREFIX) for k in keys)
    for table in config(kind).tables:
        assert f"model.{EBC_PATHS[kind]}.embedding_bags.{table.name}.weight" in keys
    inner = [PREDICTION_PREFIX + k for k in model.model.state_dict()]
    assert keys == inner  # the prefix is the only addition
    train = build_train_model(config(kind))
    assert list(train.state_dict()) == [PREDICTION_PREFIX + k for k in keys]
    assert train.prediction_model is train.model


def test_logits_are_the_architectures_own():
    torch.manual_seed(0)
    dlrm = build_model(config("dlrm"))
    b = batch("dlrm")
    torch.testing.assert_close(
        dlrm(b.dense_features, b.sparse_features), dlrm.model(b.dense_features, b.sparse_features)[:, 0]
    )
    tt = build_model(config("two_tower"))
    b = batch("two_tower")
    q, c = tt.model(b.sparse_features)
    torch.testing.assert_close(tt(b.dense_features, b.sparse_features), (q * c).sum(1))
    assert isinstance(dlrm, DLRMPrediction) and isinstance(tt, TwoTowerPrediction)


@pytest.mark.parametrize("kind", KINDS)
def test_train_model_takes_a_step_on_tables_and_dense_layers(kind):
    torch.manual_seed(0)
    train = build_train_model(config(kind), fused_optimizer=FusedOptimizerConfig(optimizer="sgd", lr=0.5))
    assert isinstance(train, TwoTowerTrainTask if kind == "two_tower" else DLRMTrain)
    before = {k: v.clone() for k, v in train.state_dict().items()}
    dense = [p for n, p in train.named_parameters() if "embedding_bags" not in n]
    opt = torch.optim.SGD(dense, lr=0.1)
    b = batch(kind)
    loss, (detached, logits, labels) = train(b)
    assert loss.isfinite() and logits.shape == labels.shape == (6,)
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = train.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    table_keys = {k for k in before if "embedding_bags" in k}
    assert changed & table_keys, "no embedding row moved (fused optimizer)"
    assert changed - table_keys, "no dense parameter moved"


def test_device_and_fused_optimizer_reach_the_collection():
    model = build_model(
        config("dlrm"), fused_optimizer=FusedOptimizerConfig(optimizer="adam", lr=0.3), device="cpu"
    )
    ebc = model.model.sparse_arch.embedding_bag_collection
    assert ebc.fused_optimizer_config.lr == 0.3 and ebc.device == torch.device("cpu")
