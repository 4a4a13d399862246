"""Client side of recserve: ``PredictorClient`` and the load generator (``recserve.client.loadgen``)."""

from recserve.client.client import PredictorClient, ServedModel, SparseFeatureInfo, kjt_from_lists

__all__ = ["PredictorClient", "ServedModel", "SparseFeatureInfo", "kjt_from_lists"]
