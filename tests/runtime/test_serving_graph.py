"""The predictor's TorchScript graph scores exactly as the eager model, on either of its paths, for every
model kind and layout, and is dropped (the eager model serves) when it cannot reproduce the model."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import Tensor, nn

from recserve.export import export_package
from recserve.runtime import Predictor
from recserve.runtime.quant_embedding import QuantEmbeddingBagCollection
from recserve.runtime.serving_graph import build_serving_graph
from rectrain.embedding import EmbeddingBagConfig
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import dlrm_config, request, trained_state
from tests.export.torchrec_fixtures import two_tower_config


def _sum_tables(dim: int = 8) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=dim, feature_names=[f"f{i}"])
        for i, n in enumerate((60, 40, 30))
    ]


def _dlrm(kind: str = "dlrm") -> ModelConfig:
    return ModelConfig(
        kind=kind,
        tables=_sum_tables(),
        dense_in_features=5,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
        dcn_num_layers=2,
        dcn_low_rank_dim=4,
    )


CASES = {
    # name: (config, export options, whether the lookups run inside the graph)
    "dlrm, one kernel": (_dlrm(), {}, True),
    "dlrm_dcn, one kernel": (_dlrm("dlrm_dcn"), {}, True),
    "dlrm, bf16 dense part": (_dlrm(), {"dense_dtype": "bf16"}, True),
    "dlrm, mixed table dtypes": (_dlrm(), {"table_dtypes": {"t0": "int4", "t1": "fp16"}}, True),
    "two_tower": (two_tower_config(), {}, True),
    "MEAN and shared features (two kernels)": (dlrm_config(), {}, False),
    "tables split over two devices": (_dlrm(), {"devices": ["cpu:0", "cpu:1"]}, False),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory) -> tuple[ModelConfig, Predictor, bool]:
    cfg, options, fused = CASES[request.param]
    path = export_package(
        tmp_path_factory.mktemp("pkg") / "p",
        model_config=cfg,
        state_dict=trained_state(cfg),
        force=True,  # random weights: the accuracy report is not what this tests
        **options,
    )
    return cfg, Predictor.load(path), fused


def _eager_logits(predictor: Predictor, dense: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
    graph, predictor.graph = predictor.graph, None
    try:
        return predictor.predict_logits(dense, kjt)
    finally:
        predictor.graph = graph


def _lookups_path(model: nn.Module) -> str:
    return next(n for n, m in model.named_modules() if isinstance(m, QuantEmbeddingBagCollection))


def _lookups(predictor: Predictor) -> QuantEmbeddingBagCollection:
    return predictor.model.get_submodule(_lookups_path(predictor.model))


def _in_kernel_order(predictor: Predictor, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
    return kjt.permute([kjt.keys().index(name) for name in _lookups(predictor).feature_order])


@pytest.mark.parametrize("batch", [1, 6, 37])
def test_graph_scores_exactly_as_the_eager_model(case, batch):
    cfg, predictor, fused = case
    assert predictor.graph is not None
    assert predictor.graph.fused == fused
    dense, kjt = request(cfg, batch, seed=batch)  # keys reversed plus one the model ignores: routed
    for features in (kjt, _in_kernel_order(predictor, kjt)):  # as the kernel takes them: fused when it can
        got = predictor.predict_logits(dense, features)
        assert got.shape == (batch,)
        assert torch.equal(got, _eager_logits(predictor, dense, features))


def test_fused_path_is_taken_for_keys_in_kernel_order(case):
    cfg, predictor, fused = case
    lookups = _lookups(predictor)
    dense, kjt = request(cfg, 4)
    assert lookups.single_kernel_inputs(kjt) is None  # reversed keys must be routed
    ordered = _in_kernel_order(predictor, kjt)
    assert (lookups.single_kernel_inputs(ordered) is not None) == fused


class _ScaledByItsInput(nn.Module):
    """A model whose Python reads a value from its input: a trace freezes that value, so must be refused."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, dense: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
        return self.inner(dense, kjt) * float(dense.abs().sum())


def test_a_graph_that_does_not_reproduce_the_model_is_dropped(tmp_path, caplog):
    cfg = _dlrm()
    path = export_package(tmp_path / "p", model_config=cfg, state_dict=trained_state(cfg), force=True)
    predictor = Predictor.load(path, dense_dtype="fp32")  # the fp32 graph is built below
    model, meta = _ScaledByItsInput(predictor.model), predictor.metadata
    with caplog.at_level(logging.WARNING, logger="recserve.runtime.serving_graph"):
        graph = build_serving_graph(
            model, _lookups_path(model), meta.dense_in_features, meta.num_embeddings, torch.float32
        )
    assert graph is None
    assert "does not reproduce its logits" in caplog.text
