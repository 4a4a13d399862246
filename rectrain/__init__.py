"""rectrain: TorchRec-compatible sparse types, FBGEMM embedding collections and sharded training."""

__version__ = "0.1.0"
