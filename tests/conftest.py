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


# The files of the longest end-to-end tests (``--durations`` of the whole suite on the quiet 2-core CI
# machine), longest first. Only an order: a file missing here still runs, among the other slow files.
LONGEST_FILES = (
    "tests/test_main_job.py",
    "tests/distributed/test_faults.py",
    "tests/deploy/test_pipeline.py",
    "tests/serving/test_processes.py",
    "tests/test_readme.py",
    "tests/export/test_torchrec_import.py",
    "tests/distributed/test_golden_training_parity.py",
    "tests/examples/test_recipes_learn.py",
)


def _start_rank(item, slow_files) -> int:
    """0.. for the longest files in their order, then the other slow files, then the rest."""
    relative = item.path.relative_to(item.config.rootpath).as_posix()
    if relative in LONGEST_FILES:
        return LONGEST_FILES.index(relative)
    return len(LONGEST_FILES) + (item.path not in slow_files)


def pytest_collection_modifyitems(config, items):
    # Files holding a slow test run first, the longest first, each file's tests together and in order
    # (module fixtures are built once). pytest-xdist's worksteal gives each worker a contiguous half of
    # this order and a worker that runs out steals from the end of the other's queue: the long tests start
    # early and short ones fill in at the end, instead of one long end-to-end test running alone.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _start_rank(item, slow_files))
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
