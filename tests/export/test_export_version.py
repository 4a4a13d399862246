"""Issue 43: export writes only versions the runtime reads (ASCII digits, as Triton's version folders), and
leaves nothing behind when it refuses one."""

from __future__ import annotations

import re

import pytest

from recserve.errors import ExportError
from recserve.export import export_package
from tests.export.common import dlrm_config, trained_state

CFG = dlrm_config()


@pytest.mark.parametrize("version", ["1\n", "v2"])
def test_export_refuses_a_version_that_is_not_digits(tmp_path, version):
    out = tmp_path / "pkg"
    with pytest.raises(
        ExportError, match=re.escape(f"{out}: --version: version {version!r} must be digits only")
    ):
        export_package(out, model_config=CFG, state_dict=trained_state(CFG), version=version)
    assert list(tmp_path.iterdir()) == []  # no package and no staging directory
