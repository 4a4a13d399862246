"""recserve: export trained rectrain models as quantized packages and serve them over gRPC."""

__version__ = "0.1.0"
