"""Columnar data: converted files (``rectrain data convert``) and users' Parquet, read by row ranges."""

from rectrain.datasets.columnar.dataset import ColumnarConfig, ColumnarDataset
from rectrain.datasets.columnar.manifest import ColumnarManifest
from rectrain.datasets.columnar.part_files import DataFormatError

__all__ = ["ColumnarConfig", "ColumnarDataset", "ColumnarManifest", "DataFormatError"]
