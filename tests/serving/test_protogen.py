"""The stub build step: foreign-package protos in a private pool, and stubs regenerated for the runtime."""

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google import protobuf
from google.protobuf import descriptor_pool

from recserve.server.transports import protogen
from recserve.server.transports.protos import oip_pb2, pb2


def test_oip_messages_stay_out_of_the_default_pool():
    """tritonclient and KServe register inference.* there; ours must not, or importing both fails."""
    assert oip_pb2.ModelInferRequest.DESCRIPTOR.full_name == "inference.ModelInferRequest"
    assert oip_pb2.DESCRIPTOR.pool is not descriptor_pool.Default()
    with pytest.raises(KeyError):  # tritonclient's file may be there (its tests import it), ours never
        descriptor_pool.Default().FindFileByName(oip_pb2.DESCRIPTOR.name)
    # our own package stays in the default pool, where grpc reflection and other tools look
    assert descriptor_pool.Default().FindMessageTypeByName("recserve.v1.PredictRequest") is not None
    assert pb2.PredictRequest.DESCRIPTOR.full_name == "recserve.v1.PredictRequest"


def test_a_file_defining_the_same_inference_symbols_imports_beside_ours():
    """What tritonclient's service_pb2 does, in a fresh interpreter that imported ours first."""
    code = (
        "from recserve.server.transports.protos import oip_pb2\n"
        "from google.protobuf import descriptor_pool\n"
        "descriptor_pool.Default().AddSerializedFile(oip_pb2.DESCRIPTOR.serialized_pb)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize(
    ("made_pb", "made_grpc", "runtime_pb", "runtime_grpc", "accepted"),
    [
        ("7.35.1", "1.85.1", "7.36.2", "1.85.1", True),
        ("7.35.1", "1.85.1", "6.33.6", "1.85.1", False),  # the tritonclient environment
        ("6.33.5", "1.81.1", "7.36.2", "1.85.1", False),  # other major
        ("6.33.5", "1.81.1", "6.33.6", "1.85.1", True),
        ("6.33.5", "1.81.1", "6.31.0", "1.85.1", False),  # runtime older than the generator
        ("6.33.5", "1.85.1", "6.33.6", "1.81.1", False),  # grpcio older than the generator
    ],
)
def test_runtime_accepts_follows_protobuf_and_grpcio_rules(
    made_pb, made_grpc, runtime_pb, runtime_grpc, accepted
):
    stub = f"# Protobuf Python Version: {made_pb}\nGRPC_GENERATED_VERSION = '{made_grpc}'\n"
    assert protogen.runtime_accepts(stub, runtime_pb, runtime_grpc) is accepted


def test_the_stubs_in_use_are_accepted_by_this_runtime():
    for path in (oip_pb2.__file__, pb2.__file__):
        assert protogen.runtime_accepts(Path(path).read_text(), protobuf.__version__, grpc.__version__)
    assert not protogen.is_stale()
