"""The control plane is never on the data plane: every state-changing call sent to the serving ports.

By default (``--model-control none``) Triton's repository load/unload are refused on the gRPC and REST
ports, whoever sends them; with ``--model-control explicit`` they need the admin token when one is set. The
Triton calls recserve does not serve at all (shared memory, trace and log settings) are unknown there.
"""

import grpc
import pytest
import requests

from recserve.server.operations.config import ServeConfig, ServeConfigError
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc

from .conftest import random_batch, running_server, target
from .test_oip import infer_request

TOKEN = "s3cret"
GRPC_CALLS = {
    "RepositoryModelLoad": oip_pb2.RepositoryModelLoadRequest,
    "RepositoryModelUnload": oip_pb2.RepositoryModelUnloadRequest,
}
REST_CALLS = ("/v2/repository/models/tiny/load", "/v2/repository/models/tiny/unload")
# Triton's other state-changing calls: recserve has none of them, so they change nothing.
UNSERVED_GRPC = ("SystemSharedMemoryRegister", "CudaSharedMemoryRegister", "TraceSetting", "LogSettings")
UNSERVED_REST = (
    "/v2/systemsharedmemory/region/r/register",
    "/v2/cudasharedmemory/region/r/register",
    "/v2/trace/setting",
    "/v2/logging",
    "/v2/models/tiny/trace/setting",
)


def _grpc_call(server, name: str, metadata=()) -> grpc.StatusCode:
    with grpc.insecure_channel(target(server)) as channel:
        stub = oip_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            getattr(stub, name)(GRPC_CALLS[name](model_name="tiny"), metadata=metadata, timeout=60)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def _unserved_grpc(server, name: str) -> grpc.StatusCode:
    with grpc.insecure_channel(target(server)) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{name}")
        try:
            call(b"", timeout=30)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def _rest(server, path: str, headers=None) -> int:
    url = f"http://127.0.0.1:{server.http_port}{path}"
    return requests.post(url, json={}, headers=headers or {}, timeout=60).status_code


def _still_serves(server) -> None:
    with grpc.insecure_channel(target(server)) as channel:
        stub = oip_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelInfer(infer_request(*random_batch(2, seed=4), raw=True), timeout=30).model_version


def test_the_default_refuses_every_state_changing_call_on_the_data_ports(package):
    with running_server(package, admin_token=TOKEN) as server:
        for name in GRPC_CALLS:
            for metadata in ((), (("authorization", f"Bearer {TOKEN}"),)):  # credentials do not matter
                assert _grpc_call(server, name, metadata) == grpc.StatusCode.PERMISSION_DENIED, name
        for path in REST_CALLS:
            for headers in (None, {"Authorization": f"Bearer {TOKEN}"}):
                assert _rest(server, path, headers) == 403, path
        for name in UNSERVED_GRPC:
            assert _unserved_grpc(server, name) == grpc.StatusCode.UNIMPLEMENTED, name
        for path in UNSERVED_REST:
            assert _rest(server, path) == 404, path
        _still_serves(server)
        assert server.core.current is not None


def test_explicit_model_control_needs_the_admin_token(package):
    with running_server(package, admin_token=TOKEN, model_control="explicit") as server:
        for name in GRPC_CALLS:
            assert _grpc_call(server, name) == grpc.StatusCode.UNAUTHENTICATED, name
            wrong = (("authorization", "Bearer guess"),)
            assert _grpc_call(server, name, wrong) == grpc.StatusCode.UNAUTHENTICATED, name
        for path in REST_CALLS:
            assert _rest(server, path) == 401, path
            assert _rest(server, path, {"Authorization": "Bearer guess"}) == 401, path
        _still_serves(server)
        good = (("authorization", f"Bearer {TOKEN}"),)
        assert _grpc_call(server, "RepositoryModelUnload", good) == grpc.StatusCode.OK
        assert server.core.current is None
        assert _rest(server, "/v2/repository/models/tiny/load", {"Authorization": f"Bearer {TOKEN}"}) == 200
        _still_serves(server)


def test_explicit_model_control_off_loopback_needs_credentials(package):
    with pytest.raises(ServeConfigError, match="--model-control explicit: .*--admin-token"):
        ServeConfig(package=package, host="0.0.0.0", model_control="explicit")
    ServeConfig(package=package, host="0.0.0.0", model_control="explicit", admin_token=TOKEN)
    with pytest.raises(ServeConfigError, match="--watch already decides"):
        ServeConfig(watch=package.parent, model_control="explicit")
    with pytest.raises(ServeConfigError, match="--model-control: expected one of"):
        ServeConfig(package=package, model_control="poll")
