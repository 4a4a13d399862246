"""The Dockerfile, checked without Docker: stages, non-root user, entrypoints that are the project's console
scripts, a default command the real CLI accepts, the gRPC health check and a minimal build context."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from tests.deploy.dockerfile import Dockerfile, DockerIgnore, exec_form, healthcheck_command
from tests.deploy.manifests import REPO, read_command

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _pin(name: str) -> str:
    for requirement in PYPROJECT["project"]["dependencies"]:
        match = re.fullmatch(rf"{re.escape(name)}==(\S+)", requirement)
        if match:
            return match.group(1)
    raise AssertionError(f"pyproject.toml pins no {name}")


def test_stages_build_a_cpu_image_by_default_with_a_cuda_option(dockerfile: Dockerfile):
    names = [s.name for s in dockerfile.stages]
    assert names[-1] == "recserve", "the default target (last stage) is the server image"
    assert {"base", "build", "runtime", "rectrain", "recserve"} <= set(names)
    assert dockerfile.global_args["BASE"] == "python:3.11-slim"
    build = dockerfile.stage("build")
    assert "VARIANT=cpu" in build.all("ARG")
    run = " ".join(build.all("RUN"))
    assert f"torch=={_pin('torch')}" in run
    assert f"fbgemm-gpu=={_pin('fbgemm-gpu-cpu')}" in run, "the CUDA variant pins FBGEMM like pyproject"
    for stage in ("rectrain", "recserve"):
        chain = [s.name for s in dockerfile.lineage(stage)]
        assert "build" not in chain, f"{stage} must not carry the build stage's layers: {chain}"
        copies = " ".join(s for st in dockerfile.lineage(stage) for s in st.all("COPY"))
        assert "--from=build /opt/venv /opt/venv" in copies


@pytest.mark.parametrize("stage", ["rectrain", "recserve"])
def test_images_run_as_a_non_root_user_created_in_the_image(dockerfile: Dockerfile, stage: str):
    user = dockerfile.inherited(stage, "USER")
    assert user is not None, f"stage {stage} runs as root (no USER)"
    uid = user.split(":")[0]
    assert uid not in ("root", "0"), user
    created = " ".join(run for s in dockerfile.lineage(stage) for run in s.all("RUN"))
    assert re.search(rf"useradd\b.*--uid {uid}\b", created), f"USER {user} is not created by useradd"


@pytest.mark.parametrize("stage", ["rectrain", "recserve"])
def test_entrypoint_is_a_console_script_and_the_default_command_parses(dockerfile: Dockerfile, stage: str):
    entrypoint = exec_form(dockerfile.inherited(stage, "ENTRYPOINT"), f"{stage} ENTRYPOINT")
    assert entrypoint == [stage]
    scripts = PYPROJECT["project"]["scripts"]
    assert stage in scripts, f"pyproject.toml [project.scripts] has no {stage!r}: {scripts}"
    module, attr = scripts[stage].split(":")
    assert callable(getattr(importlib.import_module(module), attr))
    cmd = exec_form(dockerfile.inherited(stage, "CMD"), f"{stage} CMD")
    read_command(entrypoint + cmd, f"Dockerfile stage {stage}")


def test_server_image_health_check_probes_the_served_grpc_port(dockerfile: Dockerfile):
    stage = dockerfile.stage("recserve")
    entrypoint = exec_form(stage.last("ENTRYPOINT"), "ENTRYPOINT")
    serve = read_command(entrypoint + exec_form(stage.last("CMD"), "CMD"), "recserve CMD").args
    assert {int(p) for p in " ".join(stage.all("EXPOSE")).split()} == {serve.port, serve.metrics_port}
    assert serve.host == serve.metrics_host == "0.0.0.0", "published ports need non-loopback listeners"
    check = healthcheck_command(stage.last("HEALTHCHECK"))
    assert check[0] == "python" and len(check) == 2
    copies = [c.split() for s in dockerfile.lineage("recserve") for c in s.all("COPY")]
    (source,) = [c[-2] for c in copies if c[-1] == check[1]]
    assert (REPO / source).is_file(), source
    env = dict(kv.split("=", 1) for e in stage.all("ENV") for kv in e.split())
    spec = importlib.util.spec_from_file_location("healthcheck", REPO / source)
    healthcheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(healthcheck)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECSERVE_PORT", env["RECSERVE_PORT"])
        args = healthcheck.build_parser().parse_args([])
    assert args.target == f"127.0.0.1:{serve.port}"
    assert args.service == "recserve.v1.Predictor"


def test_build_context_holds_what_the_install_needs_and_nothing_else(dockerfile: Dockerfile):
    ignore = DockerIgnore(REPO / ".dockerignore")
    needed = ["pyproject.toml", "README.md", "rectrain/cli.py", "recserve/__init__.py", "protos/recserve"]
    needed += ["deploy/docker/healthcheck.py"] + (["setup.py"] if (REPO / "setup.py").exists() else [])
    for path in needed:
        assert (REPO / path).exists(), path
        assert not ignore.excluded(path), f".dockerignore keeps {path} out of the build context"
    for path in [".git/config", ".venv/bin/python", "tests/conftest.py", "out/run/x", "deploy/k8s/x.yaml"]:
        assert ignore.excluded(path), f".dockerignore lets {path} into the build context"
    assert ignore.excluded("rectrain/__pycache__/cli.cpython-311.pyc")
    for stage in dockerfile.stages:
        for copy in stage.all("COPY"):
            parts = copy.split()
            if not any(p.startswith("--from=") for p in parts) and parts[0] != ".":
                assert not ignore.excluded(parts[0]), f"COPY {copy}: excluded by .dockerignore"


def test_build_context_alone_builds_a_wheel_with_the_grpc_stubs_and_both_commands(tmp_path: Path):
    """What the build stage's `pip install .` does, from the files .dockerignore admits (no network)."""
    context = tmp_path / "context"
    for rel in DockerIgnore(REPO / ".dockerignore").context_files(REPO):
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, context / rel)
    assert not (context / "recserve" / "v1").exists(), "generated stubs are rebuilt, not copied"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    build = subprocess.run(
        [*pip_wheel, "-w", str(tmp_path), "."], cwd=context, capture_output=True, text=True, timeout=300
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "recserve/v1/predictor_pb2_grpc.py" in names and "recserve/oip/grpc_predict_v2_pb2.py" in names
    assert not any(n.startswith("tests/") for n in names)
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    for script, target in PYPROJECT["project"]["scripts"].items():
        assert f"{script} = {target}" in text
