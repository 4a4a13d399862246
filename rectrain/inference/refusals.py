"""TorchRec's inference paths that rectrain does not take, each refused by name with what to use instead.

TorchRec serves through torch.package archives loaded by a C++ torch.deploy server, with quantized tables
sharded over GPUs. rectrain's serving artefact is a recserve model package (safetensors + a JSON manifest,
no pickled code), and recserve places the quantized tables over serving devices itself.
"""

from __future__ import annotations

from rectrain.errors import RecTrainError


class InferencePathRefused(RecTrainError, NotImplementedError):
    """A TorchRec inference API that needs torch.package, torch.deploy or sharded GPU inference."""


_EXPORT = (
    "export the model with recserve.export.export_package(out_dir, model_config=..., model=model) (or "
    "`recserve export`) and serve the package with recserve.runtime.Predictor.load(out_dir) or "
    "`recserve serve`"
)
_WHY = {
    "shard_quant_model": "shards a quantized model over GPUs with TorchRec's inference sharders; recserve "
    "places quantized tables over serving devices at export (export_package(..., devices=['cuda:0', "
    "'cuda:1']))",
    "PredictFactory": "describes a model for TorchRec's torch.deploy server",
    "PredictModule": "wraps a model for TorchRec's torch.deploy server",
    "BatchingMetadata": "describes request batching for TorchRec's C++ server; recserve's server batches",
    "QualNameMetadata": "describes methods for TorchRec's torch.deploy server",
    "quantize_dense": "casts a PredictModule's dense part for torch.deploy; recserve casts it at export "
    "(export_package(..., dense_dtype='fp16'))",
    "set_pruning_data": "prunes rows of quantized tables, which rectrain's quantized collections do not do",
    "get_table_to_weights_from_tbe": "reads FBGEMM kernels registered in a TorchRec model; rectrain.quant "
    "collections give their rows with quantized_tables()",
    "assign_weights_to_tbe": "writes FBGEMM kernels registered in a TorchRec model; load a state dict into "
    "the rectrain.quant collection instead",
    "DEFAULT_SHARDERS": "are TorchRec's inference sharders for GPU serving",
    "PredictFactoryPackager": "writes a torch.package archive (pickled code) for torch.deploy",
    "load_config_text": "reads a torch.package archive",
    "load_pickle_config": "unpickles from a torch.package archive",
    "ShardedQuantEmbeddingBagCollection": "is TorchRec's GPU-sharded quantized collection",
    "QuantEmbeddingBagCollectionSharder": "shards quantized collections for TorchRec's GPU inference",
    "QuantFeatureProcessedEmbeddingBagCollectionSharder": "shards feature-processed quantized collections, "
    "which rectrain does not have",
}


def refused(name: str) -> InferencePathRefused:
    """The error for TorchRec's ``name``: what it is for, and what rectrain/recserve offer instead."""
    return InferencePathRefused(f"torchrec {name} {_WHY[name]}; rectrain does not run it: {_EXPORT}")


def refused_names() -> frozenset[str]:
    """Every TorchRec name this module refuses."""
    return frozenset(_WHY)
