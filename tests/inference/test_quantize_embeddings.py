"""``quantize_embeddings`` swaps collections for ``rectrain.quant.EmbeddingBagCollection`` (recserve's int-N
lookups): TorchRec's swap rules and dtypes, lookups that pool the dequantized rows, a state dict the kernels
read in place, and a quantized model that exports and serves with its own scores."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from recserve.errors import ExportError
from recserve.export import dequantize_table, export_package
from recserve.runtime import Predictor
from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.inference.modules import quantize_embeddings, quantize_inference_model
from rectrain.models import DLRMTrain, build_model
from rectrain.quant import EmbeddingBagCollection as QuantEmbeddingBagCollection
from rectrain.quant.embedding_modules import quant_prep_enable_quant_state_dict_split_scale_bias
from tests.distributed.multiprocess import run_multiprocess
from tests.export.common import dlrm_config, request, trained_state

TABLES = [
    EmbeddingBagConfig(name="t0", num_embeddings=40, embedding_dim=8, feature_names=["f0", "f1"]),
    EmbeddingBagConfig(name="t1", num_embeddings=25, embedding_dim=16, feature_names=["f2"], pooling="MEAN"),
]


class Model(nn.Module):
    def __init__(self, tables: list[EmbeddingBagConfig] = TABLES, is_weighted: bool = False) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=tables, is_weighted=is_weighted)
        self.head = nn.Linear(32, 1)
        with torch.no_grad():
            for table in self.ebc.embedding_bags.values():
                table.weight.normal_(0.0, 0.5)


def _kjt(tables: list[EmbeddingBagConfig], weighted: bool = False, batch: int = 6) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(1)
    limits = {f: t.num_embeddings for t in tables for f in t.feature_names}
    lengths = torch.randint(0, 4, (len(limits) * batch,), generator=gen).view(len(limits), batch)
    values = torch.cat(
        [torch.randint(0, n, (int(lengths[i].sum()),), generator=gen) for i, n in enumerate(limits.values())]
    )
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(limits), values=values, lengths=lengths.reshape(-1), weights=weights
    )


def _pooled_from_rows(
    quantized: QuantEmbeddingBagCollection, kjt: KeyedJaggedTensor
) -> dict[str, torch.Tensor]:
    """What torch's embedding_bag pools from the dequantized rows, per feature."""
    rows = {name: dequantize_table(table) for name, table in quantized.quantized_tables().items()}
    out = {}
    for config in quantized.embedding_bag_configs():
        for feature in config.feature_names:
            jt = kjt[feature]
            out[feature] = nn.functional.embedding_bag(
                jt.values(),
                rows[config.name],
                jt.offsets(),
                mode=config.pooling.value.lower(),
                per_sample_weights=jt.weights_or_none(),
                include_last_offset=True,
            )
    return out


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_collections_are_swapped_and_pool_the_dequantized_rows(weighted):
    tables = TABLES[:1] if weighted else TABLES  # torch pools per-sample weights with SUM only
    model = Model(tables, is_weighted=weighted)
    quantized = quantize_embeddings(model, dtype=torch.qint8, inplace=False)
    assert type(model.ebc) is EmbeddingBagCollection  # inplace=False: a copy was quantized
    assert type(quantized.ebc) is QuantEmbeddingBagCollection and quantized.head is not model.head
    assert (
        quantized.ebc._get_name() == "QuantizedEmbeddingBagCollection"
        and quantized.ebc.is_weighted() == weighted
    )
    assert [c.data_type.name for c in quantized.ebc.embedding_bag_configs()] == ["INT8"] * len(tables)
    assert [c.data_type.name for c in model.ebc.embedding_bag_configs()] == ["FP32"] * len(tables)
    kjt = _kjt(tables, weighted)
    pooled, floats = quantized.ebc(kjt).to_dict(), model.ebc(kjt).to_dict()
    for feature, expected in _pooled_from_rows(quantized.ebc, kjt).items():
        torch.testing.assert_close(pooled[feature], expected, rtol=1e-5, atol=1e-5, msg=feature)
        assert (pooled[feature] - floats[feature]).abs().max() < 0.05  # int8 rows of values ~N(0, 0.5)


def test_inplace_swaps_in_the_model_itself():
    model = Model()
    assert quantize_embeddings(model, dtype=torch.qint8, inplace=True) is model
    assert type(model.ebc) is QuantEmbeddingBagCollection


@pytest.mark.parametrize(
    "dtype, name, width",
    [
        (torch.quint4x2, "INT4", lambda d: 4 + d // 2),
        (torch.quint2x4, "INT2", lambda d: 4 + d // 4),
        (torch.float16, "FP16", lambda d: 2 * d),
        (torch.float32, "FP32", lambda d: 4 * d),
    ],
)
def test_storage_dtypes_and_their_state_dict_rows(dtype, name, width):
    quantized = quantize_embeddings(Model(), dtype=dtype, inplace=False).ebc
    assert [c.data_type.name for c in quantized.embedding_bag_configs()] == [name, name]
    state = quantized.state_dict()
    for config in TABLES:
        weight = state[f"embedding_bags.{config.name}.weight"]
        assert weight.dtype == torch.uint8 and tuple(weight.shape) == (
            config.num_embeddings,
            width(config.embedding_dim),
        )
    kjt = _kjt(TABLES)
    pooled = quantized(kjt).to_dict()
    for feature, expected in _pooled_from_rows(quantized, kjt).items():
        torch.testing.assert_close(pooled[feature], expected, rtol=1e-5, atol=1e-5, msg=feature)


def test_per_table_weight_dtype_overrides_the_dtype():
    quantized = quantize_embeddings(
        Model(), dtype=torch.qint8, inplace=False, per_table_weight_dtype={"t1": torch.float16}
    )
    assert [c.data_type.name for c in quantized.ebc.embedding_bag_configs()] == ["INT8", "FP16"]


def test_the_kernels_read_the_state_dict_in_place():
    """A collection built empty (zero rows) serves another's rows once their state dict is loaded."""
    source = quantize_embeddings(Model(), dtype=torch.qint8, inplace=False).ebc
    empty = QuantEmbeddingBagCollection(source.embedding_bag_configs(), is_weighted=False, device="cpu")
    kjt = _kjt(TABLES)
    assert empty(kjt).values().abs().max() == 0
    empty.load_state_dict(source.state_dict())
    assert torch.equal(empty(kjt).values(), source(kjt).values())


def test_split_scale_bias_state_dict_views_the_same_rows():
    model = Model()
    quant_prep_enable_quant_state_dict_split_scale_bias(model.ebc)
    quantized = quantize_embeddings(model, dtype=torch.qint8, inplace=False).ebc
    state = quantized.state_dict()
    assert sorted(k for k in state if k.startswith("embedding_bags.t0.")) == [
        "embedding_bags.t0.weight",
        "embedding_bags.t0.weight_qbias",
        "embedding_bags.t0.weight_qscale",
    ]
    table = quantized.quantized_tables()["t0"]
    scale = state["embedding_bags.t0.weight_qscale"]
    assert scale.dtype == torch.float16 and tuple(scale.shape) == (40, 1)
    expected = table.weights.float() * scale.float() + state["embedding_bags.t0.weight_qbias"].float()
    torch.testing.assert_close(dequantize_table(table), expected)


def test_quantize_inference_model_swaps_by_type_name():
    model = quantize_inference_model(Model())
    assert type(model.ebc) is QuantEmbeddingBagCollection
    assert [c.data_type.name for c in model.ebc.embedding_bag_configs()] == ["INT8", "INT8"]


def test_a_quantized_model_exports_as_it_is_and_serves_its_own_scores(tmp_path):
    """export_package(model=) copies the quantized rows: the package scores as the in-process model, and
    as the float model exported at the same dtype (one quantization, export's)."""
    cfg = dlrm_config()
    train = DLRMTrain(build_model(cfg).model)
    train.model.load_state_dict({k[len("model.") :]: v for k, v in trained_state(cfg).items()})
    float_package = export_package(tmp_path / "float", model_config=cfg, model=train, dtype="int8")
    quantize_embeddings(train, dtype=torch.qint8, inplace=True)
    package = export_package(tmp_path / "quantized", model_config=cfg, model=train, dtype="fp32")
    dense, kjt = request(cfg, 16)
    with torch.no_grad():
        expected = train.model(dense, kjt).squeeze(-1)
    # The dense part in fp32 as in process (on a CPU with native bf16 it would run in bf16 by default).
    served = Predictor.load(package, dense_dtype="fp32")
    assert served.metadata.table_dtypes == {t.name: "int8" for t in cfg.tables}
    torch.testing.assert_close(served.predict_logits(dense, kjt), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        Predictor.load(float_package, dense_dtype="fp32").predict_logits(dense, kjt),
        expected,
        rtol=0,
        atol=1e-6,
    )
    with pytest.raises(ExportError, match="already quantized to int8; export the float model"):
        export_package(tmp_path / "x", model_config=cfg, model=train, table_dtypes={"t0": "int4"})


def test_the_root_module_is_not_swapped():
    """As torch's convert (TorchRec's path): children are swapped, the module passed in is not."""
    ebc = Model().ebc
    assert quantize_embeddings(ebc, dtype=torch.qint8, inplace=True) is ebc
    assert type(ebc) is EmbeddingBagCollection


def _quantize_dmp(env) -> dict:
    """On a DMP-wrapped model: what quantize_embeddings swaps, and what it logs."""
    import logging

    from rectrain.distributed import DistributedModelParallel

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("rectrain.inference.modules").addHandler(handler)
    dmp = DistributedModelParallel(Model(), env=env, device=torch.device("cpu"))
    quantized = quantize_embeddings(dmp, dtype=torch.qint8, inplace=True)
    swapped = any(isinstance(m, QuantEmbeddingBagCollection) for m in quantized.modules())
    return {"swapped": swapped, "log": records}


def test_a_collection_sharded_by_dmp_stays_float_with_a_warning():
    """TorchRec's retrieval example quantizes its DMP model: as in TorchRec, the sharded collection is no
    EmbeddingBagCollection and stays float; rectrain says so."""
    (result,) = run_multiprocess(_quantize_dmp, 1)
    assert not result["swapped"]
    assert (
        len(result["log"]) == 1
        and "stay float and sharded" in result["log"][0]
        and ".ebc" in result["log"][0]
    )
