"""Fixtures for the deploy/ tests: the real CLI parsers, the Dockerfile, the server's declared metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from tests.deploy.dockerfile import Dockerfile, read_dockerfile
from tests.deploy.manifests import REPO


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return read_dockerfile(REPO / "Dockerfile")


@pytest.fixture(scope="session")
def declared_metrics() -> dict[str, set[str]]:
    """Each sample name the server may export (``recserve_requests_total``, ``*_bucket``, ...) -> its labels.

    Read from the collectors ``recserve.server.operations.metrics.ServerMetrics`` registers, so a metric
    renamed or dropped in the code fails the dashboards and alert rules that still use it.
    """
    try:
        from recserve.server.operations.metrics import ServerMetrics
    except ImportError as e:
        pytest.fail(
            f"deploy/ needs recserve.server.operations.metrics.ServerMetrics to check its metric names: {e}"
        )
    registry = CollectorRegistry()
    ServerMetrics(registry)
    declared: dict[str, set[str]] = {}
    # prometheus_client keeps no public map from sample names to collectors; this one is stable since 0.4.
    for name, collector in registry._names_to_collectors.items():
        labels = set(getattr(collector, "_labelnames", ()))
        if isinstance(collector, Histogram) and name.endswith("_bucket"):
            labels.add("le")
        declared[name] = labels
    return declared
