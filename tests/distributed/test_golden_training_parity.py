"""TorchRec's golden_training setup trains under rectrain as under TorchRec 1.8.0, step for step.

The same job (``golden_training_parity_job.py``: DLRM, ``apply_optimizer_in_backward(RowWiseAdagrad)`` on the
tables, ``DistributedModelParallel`` on one gloo rank, ``KeyedOptimizerWrapper(Adagrad)`` for the rest,
``TrainPipelineSparseDist``) runs in the TorchRec reference venv and here, at 1 and 2 gloo ranks, from
TorchRec's state after ``DistributedModelParallel`` on the same ``RandomRecDataset`` batches; every rank's
losses agree within 1e-4 for 20 steps and the tables end up the same. The job changes no setting: at 2 ranks
both divide the tables' gradient by the world size (``comm_ops`` gradient division, on by default in both).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.distributed.agents import free_port
from tests.export.torchrec_fixtures import ROOT, torchrec_venv

JOB = Path(__file__).with_name("golden_training_parity_job.py")


def _run(python: str, package: str, out: Path, pythonpath: str | None, ranks: int) -> None:
    """The job on ``ranks`` gloo ranks: the rank processes with torchrun's rank variables, launched here (a
    torchrun agent would be one more interpreter importing torch per side); all stop when one fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    world = {"WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1"}
    world["MASTER_PORT"] = str(free_port())
    logs = [out / f"{package}{ranks}.rank{rank}.log" for rank in range(ranks)]
    procs = []
    try:
        for rank, log in enumerate(logs):
            with open(log, "w") as sink:
                rank_env = {**env, **world, "RANK": str(rank), "LOCAL_RANK": str(rank)}
                command = [python, str(JOB), package, str(out)]
                procs.append(subprocess.Popen(command, env=rank_env, stdout=sink, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 600
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # a failed rank: the others would wait for it in a collective
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    codes = [p.returncode for p in procs]
    assert codes == [0] * ranks, f"{package} ranks exited {codes}:\n" + "\n".join(
        log.read_text()[-2000:] for log in logs
    )


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_golden_training_dlrm_trains_like_torchrec(tmp_path, ranks):
    _run(str(torchrec_venv() / "bin" / "python"), "torchrec", tmp_path, None, ranks)
    _run(sys.executable, "rectrain", tmp_path, str(ROOT), ranks)
    theirs = torch.load(tmp_path / f"torchrec{ranks}.pt", weights_only=True)
    ours = torch.load(tmp_path / f"rectrain{ranks}.pt", weights_only=True)
    assert len(ours["losses"]) == ranks
    for rank, (their_losses, our_losses) in enumerate(zip(theirs["losses"], ours["losses"])):
        assert len(our_losses) == 20
        for step, (a, b) in enumerate(zip(their_losses, our_losses)):
            assert abs(a - b) <= 1e-4, f"rank {rank} step {step}: torchrec {a}, rectrain {b}"
        assert their_losses[-1] < 0.5 * their_losses[0]  # it learnt: the comparison is not of two stalls
    initial = torch.load(tmp_path / f"initial{ranks}.pt", weights_only=True)["state"]
    assert theirs["tables"].keys() == ours["tables"].keys() and len(ours["tables"]) == 26
    for key, value in theirs["tables"].items():
        torch.testing.assert_close(ours["tables"][key], value, rtol=1e-4, atol=1e-5, msg=key)
        assert not torch.equal(ours["tables"][key], initial[key])
