"""Client side of recserve: ``PredictorClient``, ``AdminClient``, the load generator (``.loadgen``).

The names are imported on first use (PEP 562), so a process that needs only the load generator's callers
(``recserve.client.loadgen``, spawned once per caller process) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from recserve.client.admin import AdminClient
    from recserve.client.client import PredictorClient, ServedModel, SparseFeatureInfo, kjt_from_lists

__all__ = ["AdminClient", "PredictorClient", "ServedModel", "SparseFeatureInfo", "kjt_from_lists"]
_MODULES = {"AdminClient": "recserve.client.admin"} | {
    name: "recserve.client.client" for name in __all__ if name != "AdminClient"
}


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module 'recserve.client' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name]), name)
