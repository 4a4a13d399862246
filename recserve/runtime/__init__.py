"""Serving runtime: load a model package and score batches in process (``Predictor``)."""

from recserve.runtime.layout import QuantizedTable, TableDType
from recserve.runtime.package import PackageManifest, read_manifest, verify_files
from recserve.runtime.placement import ServingPlacement, TableShard
from recserve.runtime.predictor import PackageMetadata, Predictor
from recserve.runtime.quant_embedding import QuantEmbeddingBagCollection

__all__ = [
    "PackageManifest",
    "PackageMetadata",
    "Predictor",
    "QuantEmbeddingBagCollection",
    "QuantizedTable",
    "ServingPlacement",
    "TableDType",
    "TableShard",
    "read_manifest",
    "verify_files",
]
