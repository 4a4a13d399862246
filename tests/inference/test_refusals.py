"""TorchRec's inference paths that need torch.package, torch.deploy or GPU-sharded inference are refused by
name, each saying what to use instead (a recserve package); what rectrain's quantized collection cannot hold
is refused before anything is built."""

from __future__ import annotations

import pytest
import torch

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from rectrain.distributed import quant_embeddingbag
from rectrain.errors import ConfigError
from rectrain.inference import model_packager, modules
from rectrain.inference.refusals import InferencePathRefused, refused_names
from rectrain.quant import EmbeddingBagCollection as QuantEmbeddingBagCollection

ALTERNATIVE = "recserve.export.export_package"


@pytest.mark.parametrize(
    "call",
    [
        lambda: model_packager.PredictFactoryPackager.save_predict_factory(object(), {}, "out.pt"),
        lambda: model_packager.load_config_text("config"),
        lambda: model_packager.load_pickle_config("config", dict),
        lambda: modules.shard_quant_model(torch.nn.Module(), world_size=2, compute_device="cuda"),
        lambda: quant_embeddingbag.ShardedQuantEmbeddingBagCollection(),
        lambda: quant_embeddingbag.QuantFeatureProcessedEmbeddingBagCollectionSharder(),
        lambda: quant_embeddingbag.QuantEmbeddingBagCollectionSharder().shard(torch.nn.Module(), {}, None),
    ],
    ids=[
        "save_predict_factory",
        "load_config_text",
        "load_pickle_config",
        "shard_quant_model",
        "ShardedQuantEmbeddingBagCollection",
        "QuantFeatureProcessedEmbeddingBagCollectionSharder",
        "QuantEmbeddingBagCollectionSharder.shard",
    ],
)
def test_torch_package_and_gpu_sharding_paths_are_refused_with_the_alternative(call):
    with pytest.raises(InferencePathRefused, match=ALTERNATIVE):
        call()


@pytest.mark.parametrize("name", ["PredictFactory", "PredictModule", "BatchingMetadata", "quantize_dense"])
def test_torch_deploy_interfaces_are_refused_when_imported(name):
    with pytest.raises(InferencePathRefused, match=rf"torchrec {name} .*{ALTERNATIVE}"):
        exec(f"from rectrain.inference.modules import {name}")
    with pytest.raises(AttributeError):
        modules.no_such_name  # noqa: B018 - other names stay attribute errors


def test_every_refusal_is_an_error_of_rectrain_and_not_implemented():
    assert {"PredictFactoryPackager", "shard_quant_model"} <= refused_names()
    assert issubclass(InferencePathRefused, NotImplementedError)


def test_the_quant_sharder_is_refused_by_distributed_model_parallel():
    from rectrain.distributed.parallel.model_parallel import refuse_unsupported_sharders

    sharder = quant_embeddingbag.QuantEmbeddingBagCollectionSharder(fused_params={"register_tbe": True})
    assert sharder.module_type is QuantEmbeddingBagCollection
    with pytest.raises(Exception, match="QuantEmbeddingBagCollectionSharder"):
        refuse_unsupported_sharders([sharder])


TABLE = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, data_type="INT8")


def test_a_quantized_collection_on_a_gpu_is_refused_naming_the_package_path():
    with pytest.raises(ConfigError, match=r"devices=\['cuda:0'\].*Predictor"):
        QuantEmbeddingBagCollection([TABLE], is_weighted=False, device=torch.device("cuda", 0))


def test_storage_types_without_a_quantized_lookup_are_refused():
    bf16 = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, data_type="BF16")
    with pytest.raises(ConfigError, match="BF16 has no quantized lookup"):
        QuantEmbeddingBagCollection([bf16], is_weighted=False, device="cpu")
    odd = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=6, data_type="INT8")
    with pytest.raises(ConfigError, match="not a multiple of 4"):
        QuantEmbeddingBagCollection([odd], is_weighted=False, device="cpu")


def test_given_rows_of_the_wrong_shape_are_refused():
    rows = {"t": (torch.zeros(10, 4, dtype=torch.uint8), torch.zeros(10, 4, dtype=torch.uint8))}
    with pytest.raises(ConfigError, match=r"table_name_to_quantized_weights\['t'\].*\[10, 8\]"):
        QuantEmbeddingBagCollection([TABLE], False, "cpu", table_name_to_quantized_weights=rows)


def test_a_meta_collection_is_refused_until_materialised():
    table = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8)
    model = torch.nn.Sequential(EmbeddingBagCollection(tables=[table], device=torch.device("meta")))
    with pytest.raises(ConfigError, match="meta device; materialise"):
        modules.quantize_embeddings(model, dtype=torch.qint8, inplace=True)


def test_sequence_collections_are_refused_by_quantize_inference_model():
    model = torch.nn.Sequential(
        EmbeddingCollection(tables=[EmbeddingConfig(name="s", num_embeddings=5, embedding_dim=4)])
    )
    with pytest.raises(ConfigError, match="EmbeddingCollections .* no quantized lookup"):
        modules.quantize_inference_model(model)
