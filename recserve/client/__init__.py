"""Client side of recserve: ``PredictorClient``, ``AdminClient``, the load generator (``.loadgen``)."""

from recserve.client.admin import AdminClient
from recserve.client.client import PredictorClient, ServedModel, SparseFeatureInfo, kjt_from_lists

__all__ = ["AdminClient", "PredictorClient", "ServedModel", "SparseFeatureInfo", "kjt_from_lists"]
