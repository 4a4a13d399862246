"""NVIDIA Triton Inference Server as a benchmark peer: its venv, a backend directory, a running server.

The ``tritonserver`` binary and its Python backend come from the ``nvidia-pytriton`` wheel, installed with
torch and FBGEMM into a venv outside the repository by scripts/triton_venv.sh (numpy < 2: the backend's stub
reads tensors wrongly under numpy 2). The model repository is what ``recserve export --triton-repository``
writes. Two things the wheel needs that PyTriton normally arranges: a backend directory holding the stub
built for this Python's minor version, and that interpreter's lib directory first on ``LD_LIBRARY_PATH``
(the stub links libpython; another copy of the same minor version fails to load the model with an
``_thread.RLock`` error).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc

from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc

REPO = Path(__file__).resolve().parent.parent


def triton_venv() -> Path:
    """The Triton venv (built by scripts/triton_venv.sh on first use, with this Python's minor version)."""
    python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "triton_venv.sh")],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHON=str(python)),
    )
    return Path(out.stdout.strip().splitlines()[-1])


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def backend_dir(venv: Path, where: Path) -> Path:
    """``where/backends`` with the Python backend and the stub for this Python (PyTriton's layout)."""
    home = site_packages(venv) / "pytriton" / "tritonserver"
    python = where / "backends" / "python"
    python.mkdir(parents=True, exist_ok=True)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    links = {
        "libtriton_python.so": home / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": home / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": home / "python_backend_stubs" / version / "triton_python_backend_stub",
    }
    for name, target in links.items():
        if not (python / name).exists():
            (python / name).symlink_to(target)
    return where / "backends"


def start_triton(venv: Path, repository: Path, backends: Path, grpc_port: int, http_port: int, log: Path):
    """``tritonserver`` on ``grpc_port`` serving ``repository`` (metrics off); its output goes to ``log``."""
    binary = site_packages(venv) / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [str(Path(sys.base_prefix) / "lib"), env.get("LD_LIBRARY_PATH", "")])
    )
    # The checkout's recserve, then the venv's torch and numpy 1.x (model.py puts these on sys.path).
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site_packages(venv))])
    cmd = [
        str(binary),
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        "--allow-metrics=false",
        "--log-verbose=0",
    ]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_model_ready(proc: subprocess.Popen, target: str, model: str, timeout_s: float = 300) -> None:
    """Returns once ``model`` is ready on the OIP server at ``target``; raises if ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = oip_pb2_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before {model} was ready")
            try:
                if stub.ModelReady(oip_pb2.ModelReadyRequest(name=model), timeout=2).ready:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError(f"{model} was not ready on {target} within {timeout_s:.0f} s")
