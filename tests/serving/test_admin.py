"""The admin plane: its own loopback port, a token or client certificates beyond loopback, reloads only from
under the reload root."""

import os
import shutil

import grpc
import pytest

from recserve.cli import main
from recserve.client import AdminClient, PredictorClient
from recserve.server.operations.config import ServeConfig, ServeConfigError, is_loopback
from recserve.server.transports.protos import pb2, pb2_grpc

from .conftest import admin_target, running_server, scrape, target


@pytest.fixture
def models(packages, tmp_path):
    root = tmp_path / "models"
    shutil.copytree(packages["1"], root / "1")
    shutil.copytree(packages["2"], root / "2")
    return root


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_admin_is_not_served_on_the_data_port(models):
    with running_server(models / "1") as server:
        stub = pb2_grpc.AdminStub(grpc.insecure_channel(target(server)))
        code, _ = _code(lambda: stub.ReloadModel(pb2.ReloadModelRequest(package_dir="2"), timeout=10))
        assert code == grpc.StatusCode.UNIMPLEMENTED
        assert PredictorClient(target(server)).metadata().version == "1"
        metrics = scrape(server)
    assert metrics["recserve_requests_total"][(("code", "UNIMPLEMENTED"), ("method", "unknown"))] == 1


def test_reload_refuses_paths_outside_the_reload_root(models, packages, tmp_path):
    outside = shutil.copytree(packages["2"], tmp_path / "elsewhere")
    os.symlink(outside, models / "link")
    with running_server(models / "1") as server:
        admin = AdminClient(admin_target(server))
        for path in ("../elsewhere", str(outside), "link", "2/../../elsewhere"):
            code, details = _code(lambda p=path: admin.reload(p))
            assert code == grpc.StatusCode.PERMISSION_DENIED, path
            assert repr(path) in details and "outside the reload root" in details
        assert admin.reload("1/../2") == ("tiny", "2", True)  # resolves inside the root: allowed
        metrics = scrape(server)
    denied = (("code", "PERMISSION_DENIED"), ("method", "recserve.v1.Admin/ReloadModel"))
    assert metrics["recserve_requests_total"][denied] == 4
    assert metrics["recserve_model_reloads_total"][(("result", "success"),)] == 1


def test_admin_token_is_required_when_set(models):
    with running_server(models / "1", admin_token="s3cret") as server:
        for token in (None, "wrong"):
            code, details = _code(lambda t=token: AdminClient(admin_target(server), token=t).reload("2"))
            assert code == grpc.StatusCode.UNAUTHENTICATED and "--admin-token" in details
        assert PredictorClient(target(server)).metadata().version == "1"
        assert AdminClient(admin_target(server), token="s3cret").reload("2") == ("tiny", "2", True)
        metrics = scrape(server)
    unauth = (("code", "UNAUTHENTICATED"), ("method", "recserve.v1.Admin/ReloadModel"))
    assert metrics["recserve_requests_total"][unauth] == 2


def test_admin_beyond_loopback_needs_a_token_or_client_certificates(package, capsys):
    with pytest.raises(ServeConfigError, match="--admin-host 0.0.0.0: .* without authentication"):
        ServeConfig(package=package, admin_host="0.0.0.0")
    assert ServeConfig(package=package, admin_host="0.0.0.0", admin_token="t").admin_host == "0.0.0.0"
    assert ServeConfig(package=package, admin_host="0.0.0.0", admin_port=None).admin_port is None
    assert main(["serve", "--package", str(package), "--admin-host", "10.1.2.3"]) == 2
    assert "--admin-token" in capsys.readouterr().err


def test_is_loopback():
    assert all(map(is_loopback, ["127.0.0.1", "127.5.0.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.com", ""]))
