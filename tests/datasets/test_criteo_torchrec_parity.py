"""TorchRec's Criteo .npy tools give the same files and batches here as under TorchRec 1.8.0: in-memory
batches (stages, ranks, hashes, training-set shuffle, batch shuffle, drop_last), tsv_to_npys,
sparse_to_contiguous and shuffle (``criteo_parity_job.py`` runs in both)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.export.torchrec_fixtures import ROOT, torchrec_venv

JOB = Path(__file__).with_name("criteo_parity_job.py")


def _run(python: str, package: str, folder: Path, pythonpath: str | None) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([python, str(JOB), package, str(folder)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.slow
def test_criteo_npy_tools_match_torchrec(tmp_path):
    _run(str(torchrec_venv() / "bin" / "python"), "torchrec", tmp_path, None)
    _run(sys.executable, "rectrain", tmp_path, str(ROOT))
    theirs = torch.load(tmp_path / "torchrec.pt", weights_only=True)
    ours = torch.load(tmp_path / "rectrain.pt", weights_only=True)
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert _same(ours[key], theirs[key]), key
