"""Issue 43: ``recserve serve`` on a hostile package stops with one line naming the file (no traceback) and
a non-zero exit; version folders are read as manifests record versions (ASCII digits)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recserve.server.operations.reload import newest_version_dir
from tests.runtime.test_package_headers import rewrite_header, table_file

from .conftest import free_port

CLI = [sys.executable, "-m", "recserve.cli", "serve"]


def _serve(package: Path, workers: int) -> subprocess.CompletedProcess:
    args = ["--package", str(package), "--workers", str(workers), "--port", str(free_port())]
    args += ["--metrics-port", "-1", "--admin-port", "-1"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=180)


def _negative_shape(package: Path, out: Path) -> tuple[Path, str]:
    copy = shutil.copytree(package, out)
    name = table_file(copy)
    key = next(iter(json.loads((copy / "manifest.json").read_text())["placement"]["shards"]))
    label = f"{key['table']}[{key['row_start']}:{key['row_end']}].rows"
    rewrite_header(copy, name, lambda header: header[label].update(shape=[-1000, -20]))
    return (
        copy,
        f"{copy / name}: tensor {label!r}: shape [-1000, -20]: must be a list of non-negative integers",
    )


def _nested_manifest(package: Path, out: Path) -> tuple[Path, str]:
    copy = shutil.copytree(package, out)
    text = (copy / "manifest.json").read_text().rstrip()
    (copy / "manifest.json").write_text(text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return copy, f"{copy / 'manifest.json'}: nested too deeply to be a model package manifest"


@pytest.mark.parametrize(
    "make", [_negative_shape, _nested_manifest], ids=["negative shape", "nested manifest"]
)
def test_a_hostile_package_is_one_line_and_a_failed_start(package, tmp_path, make):
    bad, message = make(package, tmp_path / "bad")
    done = _serve(bad, workers=1)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 2, done.stderr[-3000:]
    assert errors == [f"recserve serve: error: {message}"], done.stderr[-3000:]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_each_worker_says_it_in_one_line(package, tmp_path):
    bad, message = _negative_shape(package, tmp_path / "bad")
    done = _serve(bad, workers=2)
    assert done.returncode != 0
    # Each worker that reaches the package says so in one line; the first to fail stops the other, which
    # on a loaded machine may not have read the package yet.
    said = [line for line in done.stderr.splitlines() if "cannot serve" in line]
    assert 1 <= len(said) <= 2, done.stderr[-3000:]
    assert all(line.endswith(f"cannot serve: {message}") for line in said), done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_only_ascii_digit_folders_are_versions(package, tmp_path):
    for folder in ("2", "10", "²", "٣٣", "11a", "1\n"):
        shutil.copytree(package, tmp_path / folder)
    assert newest_version_dir(tmp_path) == tmp_path / "10"  # '²'.isdigit() holds, but int('²') fails


def test_watching_a_directory_without_versions_is_one_line(tmp_path):
    (tmp_path / "models").mkdir()
    args = ["--watch", str(tmp_path / "models"), "--workers", "1", "--port", str(free_port())]
    args += ["--metrics-port", "-1", "--admin-port", "-1"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stderr[-3000:]
    expected = f"--watch {tmp_path / 'models'}: no numbered version directory holds a manifest.json"
    assert f"recserve serve: error: {expected}" in done.stderr.splitlines(), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
