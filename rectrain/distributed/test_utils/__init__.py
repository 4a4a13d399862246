"""``torchrec.distributed.test_utils``: models and inputs for users' sharding tests."""
