"""A pipeline package exported once per session (tests/recommend/fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.recommend.fixtures import make_pipeline


@pytest.fixture(scope="session")
def pipeline_dir(tmp_path_factory) -> Path:
    return make_pipeline(tmp_path_factory.mktemp("pipeline"))
