import os

import pytest
import torch

# Hypothesis examples run in CI on a 2-core machine: keep them bounded and without wall-clock deadlines.
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    settings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
