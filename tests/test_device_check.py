"""scripts/device_check.sh and its helpers, as far as a machine without a GPU can check them (issue 39).

The check itself only runs on a GPU machine (docs/gpu.md); here: both shell scripts parse, the check refuses
at once and clearly without a CUDA device, big wheels survive being cut into parts and put back, and the
table reads the lines the benchmarks end with.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_scripts_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


wheel_parts = _load("wheel_parts")
report = _load("device_check_report")


@pytest.mark.parametrize("script", ["device_check.sh", "gpu_wheels.sh"])
def test_the_scripts_parse(script):
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)


def test_without_a_cuda_device_the_check_refuses_at_once(tmp_path):
    env = {**os.environ, "NVIDIA_SMI": "false", "PYTHON": sys.executable}
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(SCRIPTS / "device_check.sh"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert time.monotonic() - started < 10
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr and "docs/gpu.md" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing installed, run or written


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="torch sees a GPU here: the second refusal does not apply"
)
def test_a_gpu_that_torch_cannot_see_is_refused_too(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    env = {**os.environ, "NVIDIA_SMI": str(smi), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPTS / "device_check.sh")], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2
    assert "no CUDA device visible to" in done.stderr


def test_every_stage_of_the_script_has_a_row_in_the_table():
    script = (SCRIPTS / "device_check.sh").read_text()
    stages = re.findall(r"^\s*stage (\w+) \d+", script, flags=re.MULTILINE)
    assert [s for s in stages if s != "versions"] == list(report.STAGES)


def _wheel(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/__init__.py", "x = 1\n")
        z.writestr("pkg/_kernels.so", payload)
        z.writestr("pkg-1.0.dist-info/RECORD", "pkg/__init__.py,,\n")
    return path


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name) for name in z.namelist()}


def test_a_big_wheel_is_cut_into_parts_and_put_back(tmp_path):
    base = tmp_path / "wheels" / "base"
    base.mkdir(parents=True)
    big = _wheel(base / "big-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", os.urandom(300_000))
    small = _wheel(base / "small-1.0-py3-none-any.whl", b"tiny")
    original = _members(big)
    manifest = wheel_parts.split(tmp_path / "wheels", mb=0.1, preset=1)
    parts = manifest[big.name]["parts"]
    assert len(parts) == 3 and not big.exists() and small.exists()
    assert [Path(p).parent.name for p in parts] == ["part-01", "part-02", "part-03"]
    assert all((tmp_path / "wheels" / p).stat().st_size <= 0.1 * 2**20 for p in parts)

    wheels = wheel_parts.join(tmp_path / "wheels", tmp_path / "house")
    assert sorted(w.name for w in wheels) == sorted([big.name, small.name])
    rebuilt = tmp_path / "house" / big.name
    assert _members(rebuilt) == original  # same files, so the same RECORD: pip installs it as before
    with zipfile.ZipFile(rebuilt) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}


def test_a_missing_or_damaged_part_is_named(tmp_path):
    base = tmp_path / "wheels" / "base"
    base.mkdir(parents=True)
    big = _wheel(base / "big-1.0-py3-none-any.whl", os.urandom(200_000))
    parts = wheel_parts.split(tmp_path / "wheels", mb=0.1, preset=1)[big.name]["parts"]
    last = tmp_path / "wheels" / parts[-1]
    data = last.read_bytes()
    last.unlink()
    with pytest.raises(wheel_parts.PartsError, match=r"1 of 2 parts missing; carry .*part-02"):
        wheel_parts.join(tmp_path / "wheels", tmp_path / "house")
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0xFF
    last.write_bytes(bytes(damaged))
    with pytest.raises(wheel_parts.PartsError, match=r"big-1.0-py3-none-any.whl: a part is damaged"):
        wheel_parts.join(tmp_path / "wheels", tmp_path / "house")
    assert not (tmp_path / "house" / big.name).exists()


# The last lines the benchmarks print (their f-strings, with numbers), as the check's stage logs hold them.
LOGS = {
    "gpu_tests": "....s.\n23 passed, 1 skipped, 3 deselected, 2 warnings in 61.20s (0:01:01)\n",
    "train_2048": "  run 0: rectrain 450123, torchrec 409000 examples/s\n"
    "torchrec train examples/s 409000\nratio vs torchrec 1.10\nrectrain train examples/s 450123\n",
    "infer_512": "\nbatch 512, int8: rectrain 801,234 examples/s, TorchRec 640,000 examples/s, ratio 1.25x\n"
    "rectrain int8 infer examples/s 801234\n",
    "ebc_step": "     rectrain ebc:     0.93 ms/step\n  raw fbgemm tbe:     0.90 ms/step\n"
    " nn.EmbeddingBag:     3.10 ms/step\nrectrain ebc fwd+bwd vs raw fbgemm on cuda 1.033\n",
    "serve": "in-process int8 predict at batch 512 on cuda: 900,000 examples/s\n"
    "recserve served examples/s 120000 p99_ms 4.20 ratio 0.133\n",
}


def test_the_table_reads_the_benchmarks_last_lines(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    stages = ["install\tok\t0\t40", "versions\tok\t0\t3"]
    for name, text in LOGS.items():
        (work / f"{name}.log").write_text(text)
        stages.append(f"{name}\tok\t0\t30")
    stages += ["main_job\tfailed (exit 1)\t1\t20", "train_16384\ttimeout (60s)\t124\t60"]
    stages.append("nccl_2\tskipped (1 GPU)\t\t0")
    (work / "stages.tsv").write_text("\n".join(stages) + "\n")
    (work / "versions.log").write_text(
        "gpu=NVIDIA H100 80GB HBM3\ngpus=1\ndriver=580.159.04\npython=3.12.3\ntorch=2.11.0+cu130\n"
        "cuda=13.0\nfbgemm_gpu=1.6.0\ntorchrec=1.6.1\nrectrain=0.1.0\n"
    )
    assert report.main(["table", str(work), "--out", str(tmp_path / "out")]) == 1  # one failed, one timed out
    rows = {r["stage"]: r for r in json.loads((tmp_path / "out/device_check.json").read_text())["stages"]}
    assert rows["gpu_tests"]["figure"] == "23 passed, 1 skipped, 3 deselected, 2 warnings"
    assert (rows["train_2048"]["figure"], rows["train_2048"]["ratio"]) == ("450,123 ex/s", "1.10x")
    assert rows["train_2048"]["baseline"] == "TorchRec 409,000 ex/s"
    assert (rows["infer_512"]["ratio"], rows["infer_512"]["goal"]) == ("1.25x", ">= 1.2x")
    assert (rows["ebc_step"]["figure"], rows["ebc_step"]["ratio"]) == ("0.930 ms/step", "1.033")
    assert rows["serve"]["figure"] == "capacity 120,000 ex/s, p99 4.20 ms at 50 %"
    assert rows["serve"]["baseline"] == "in process 900,000 ex/s"
    assert (
        rows["main_job"]["status"] == "failed (exit 1)" and rows["train_16384"]["status"] == "timeout (60s)"
    )
    table = (tmp_path / "out/device_check.txt").read_text()
    assert "GPU: NVIDIA H100 80GB HBM3 (1 visible), driver 580.159.04" in table
    assert "torch 2.11.0+cu130, cuda 13.0, fbgemm_gpu 1.6.0, torchrec 1.6.1" in table
    assert "===== train_2048" in (tmp_path / "out/device_check.log").read_text()


def test_the_main_job_row_reads_its_summary(tmp_path):
    (tmp_path / "main").mkdir()
    summary = {
        "eval_auc": 0.7312, "train_steps": 60, "served_rows": 200, "serving_device": "cuda:0",
        "served_max_abs_diff": 3e-8, "throughput_examples_per_s": 25000.0, "latency_p99_ms": 9.5,
    }  # fmt: skip
    (tmp_path / "main" / "summary.json").write_text(json.dumps(summary))
    figure = report.parse_main_job("", tmp_path)["figure"]
    assert figure == (
        "AUC 0.731 after 60 steps; served 200 rows on cuda:0 (max diff 3.0e-08); load test 25,000 ex/s, "
        "p99 9.5 ms"
    )
