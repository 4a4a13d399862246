"""Test helpers of TorchRec's datasets (``torchrec.datasets.test_utils``) that users' own tests import."""
