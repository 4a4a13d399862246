"""Helpers at the import path of TorchRec's ``torchrec.sparse.tests`` (used by tests written for TorchRec)."""
