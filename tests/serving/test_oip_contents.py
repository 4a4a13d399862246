"""Issue 43: an Open Inference Protocol input's typed ``contents`` hold only the field of its datatype; a
stray field (ignored before, so the request was scored on what the client did not mean) is INVALID_ARGUMENT
naming the input and the field."""

from __future__ import annotations

import grpc
import pytest
import torch

from recserve.errors import InvalidRequestError
from recserve.server.dataplane.validation import ModelSchema
from recserve.server.transports.oip import decode_infer_request
from recserve.server.transports.protos import oip_pb2_grpc

from .conftest import DENSE, FEATURES, ROWS, random_batch, running_server, target
from .test_oip import infer_request

# (input index in infer_request's order, stray field, a value for it, the field the datatype takes)
STRAY = {
    "INT32 lengths with int64_contents": (1, "int64_contents", [1], "int_contents"),
    "INT64 values with int_contents": (2, "int_contents", [1], "int64_contents"),
    "FP32 dense with bytes_contents": (0, "bytes_contents", [b"\x00\x00\x80\x3f"], "fp32_contents"),
    "FP32 dense with fp64_contents": (0, "fp64_contents", [1.0], "fp32_contents"),
    "INT64 values with uint64_contents": (2, "uint64_contents", [1], "int64_contents"),
    "INT32 lengths with bool_contents": (1, "bool_contents", [True], "int_contents"),
}


SCHEMA = ModelSchema(
    model_name="tiny",
    version="1",
    feature_names=FEATURES,
    num_embeddings=torch.tensor(ROWS),
    dense_in_features=DENSE,
    weighted_features=frozenset(),
    max_batch_size=64,
)


def _with_stray(case: str):
    index, stray, value, _ = STRAY[case]
    req = infer_request(*random_batch(3, seed=1), raw=False)
    getattr(req.inputs[index].contents, stray).extend(value)
    return req


@pytest.mark.parametrize("case", list(STRAY))
def test_a_stray_contents_field_is_named(case):
    index, stray, _, only = STRAY[case]
    req = _with_stray(case)
    name, datatype = req.inputs[index].name, req.inputs[index].datatype
    expected = f"inputs[{index}] ('{name}'): {stray} given for datatype {datatype}; only {only}"
    with pytest.raises(InvalidRequestError) as caught:
        decode_infer_request(req, SCHEMA)
    assert str(caught.value) == expected


def test_contents_of_the_datatype_alone_still_decode():
    arrays = decode_infer_request(infer_request(*random_batch(3, seed=1), raw=False), SCHEMA)
    assert arrays.batch_size == 3


def test_the_server_answers_invalid_argument(packages):
    with running_server(packages["1"], max_queue_delay_ms=1) as server:
        stub = oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(server)))
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(_with_stray("INT32 lengths with int64_contents"), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "inputs[1] ('f0.lengths'): int64_contents given for datatype INT32" in caught.value.details()
