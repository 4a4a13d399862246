"""The command line: the demo trains and reports, alone and sharded over two torchrun ranks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rectrain.cli import main


def test_demo_trains_and_reports(capsys):
    assert main(["demo", "--steps", "20", "--batch-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "trained 20 steps / 1,280 examples" in out
    assert "held-out accuracy" in out


@pytest.mark.slow
def test_demo_under_torchrun_shards_the_tables_over_two_ranks():
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "localhost:0",
        "-m",
        "rectrain",
        "demo",
        "--steps",
        "10",
        "--batch-size",
        "64",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sharded over 2 ranks" in done.stdout
    assert "sharding plan: world_size 2" in done.stdout
    assert "trained 10 steps / 1,280 examples" in done.stdout  # 10 steps x 64 x 2 ranks
