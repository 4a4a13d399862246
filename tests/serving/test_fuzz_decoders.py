"""A bounded coverage-guided fuzz run (atheris / libFuzzer) over the server's decoders, checks and kernels.

``scripts/fuzz_server.py`` is the fuzzer; CI runs it for 20 s here, a longer run is ``--seconds N``. Any
exception other than InvalidRequestError, or a crash in a kernel, fails the run and saves the input.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_server.py"


@pytest.mark.slow
def test_coverage_guided_fuzzing_of_the_decoders_finds_no_crash(tmp_path):
    artifacts = tmp_path / "artifacts"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "20", "--corpus", str(tmp_path / "corpus"),
         "--artifacts", str(artifacts)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    crashes = sorted(p.name for p in artifacts.iterdir()) if artifacts.exists() else []
    assert proc.returncode == 0 and not crashes, f"crash inputs {crashes} in {artifacts}:\n{output[-4000:]}"
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", output)
    assert runs is not None and int(runs.group(1)) > 1000, output[-2000:]
