"""Issue 17 against a real server: wrapping lengths, undecodable messages, inputs the model does not have.

The regression request is the one that crashed the server (SIGSEGV in FBGEMM): a 26-feature model like the
main job's, INT64 lengths 2^62, 2^62, 2^62, 2^62 + 3 and then 1 for the other 22 features, 25 values in all,
so that the int64 sum of the lengths wraps to the value count (and a variant that wraps to 0).
"""

from __future__ import annotations

import logging

import grpc
import numpy as np
import pytest
import torch

from recserve.errors import InvalidRequestError
from recserve.export import export_package
from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.validation import ModelSchema, check_request
from recserve.server.transports.codec import encode_predict_request
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc, pb2, pb2_grpc
from rectrain import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

from .conftest import random_batch, running_server, scrape, target
from .test_oip import infer_request

CATS = [f"cat_{i}" for i in range(26)]
ROWS = 100
DENSE = 13
WRAP_TO_COUNT = [2**62, 2**62, 2**62, 2**62 + 3] + [1] * 22  # int64 sum: 2^64 + 25 = 25 (mod 2^64)
WRAP_TO_ZERO = [2**62] * 4 + [0] * 22  # int64 sum: 2^64 = 0 (mod 2^64)


@pytest.fixture(scope="module")
def mainjob_server(tmp_path_factory):
    """The main job's model shape (26 one-feature tables, 13 dense features), small tables."""
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=ROWS, embedding_dim=8, feature_names=[f])
        for f in CATS
    ]
    cfg = ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=DENSE, dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
    )  # fmt: skip
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("mainjob") / "1"
    package = export_package(
        out, model_config=cfg, state_dict=build_model(cfg).state_dict(), model_name="mainjob", version="1"
    )
    with running_server(package, max_queue_delay_ms=1) as server:
        yield server


def _oip_wrapping_request(lengths: list[int]) -> oip_pb2.ModelInferRequest:
    """One example; feature i has ``lengths[i]`` as its one length and its share of the ids sent."""
    n_values = sum(lengths) % 2**64
    req = oip_pb2.ModelInferRequest(model_name="mainjob")
    req.inputs.add(name="dense", datatype="FP32", shape=[1, DENSE])
    req.raw_input_contents.append(np.zeros(DENSE, dtype="<f4").tobytes())
    # the ids go to the features the client claims are short, so every per-feature count looks plausible
    per_feature = [min(n, 1) if n < 2**62 else 0 for n in lengths]
    per_feature[-1] += n_values - sum(per_feature)
    for f, n, count in zip(CATS, lengths, per_feature):
        req.inputs.add(name=f"{f}.lengths", datatype="INT64", shape=[1])
        req.raw_input_contents.append(np.array([n], dtype=np.uint64).astype("<u8").tobytes())
        req.inputs.add(name=f"{f}.values", datatype="INT64", shape=[count])
        req.raw_input_contents.append(np.ones(count, dtype="<i8").tobytes())
    return req


def _valid_oip_request() -> oip_pb2.ModelInferRequest:
    return _oip_wrapping_request([1] * 26)


def _v1_request(lengths_int32: np.ndarray, n_values: int) -> pb2.PredictRequest:
    req = pb2.PredictRequest(batch_size=1, model_name="mainjob")
    req.dense.raw = np.zeros(DENSE, dtype="<f4").tobytes()
    req.sparse.keys.extend(CATS)
    req.sparse.lengths_raw = lengths_int32.astype("<i4").tobytes()
    req.sparse.values_raw = np.ones(n_values, dtype="<i8").tobytes()
    return req


@pytest.mark.parametrize("lengths", [WRAP_TO_COUNT, WRAP_TO_ZERO], ids=["wrap_to_count", "wrap_to_zero"])
def test_issue_request_is_invalid_argument_over_oip_and_the_server_answers_next(mainjob_server, lengths):
    stub = oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(mainjob_server)))
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(_oip_wrapping_request(lengths), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "inputs['cat_0.lengths']: length 4611686018427387904" in info.value.details()
    assert list(stub.ModelInfer(_valid_oip_request(), timeout=10).outputs[0].shape) == [1]


@pytest.mark.parametrize(
    ("lengths", "n_values"),
    [
        # the same attack in the v1 API's int32 lengths: 2^30 x 4 + 3 + 22 wraps an int32 sum to 25
        ([2**30, 2**30, 2**30, 2**30 + 3] + [1] * 22, 25),
        ([2**30] * 4 + [0] * 22, 0),
        ([2**31 - 1, -(2**31) + 2] + [1] * 24, 25),
    ],
    ids=["int32_wrap_to_count", "int32_wrap_to_zero", "int32_extremes"],
)
def test_issue_request_is_invalid_argument_over_v1_and_the_server_answers_next(
    mainjob_server, lengths, n_values
):
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(mainjob_server)))
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(_v1_request(np.array(lengths, dtype=np.int64), n_values), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "sparse.lengths: " in info.value.details() and "(feature 'cat_" in info.value.details()
    assert len(stub.Predict(_v1_request(np.ones(26, dtype=np.int64), 26), timeout=10).scores) == 1


@pytest.mark.parametrize("lengths", [WRAP_TO_COUNT, WRAP_TO_ZERO], ids=["wrap_to_count", "wrap_to_zero"])
def test_check_request_bounds_int64_lengths_before_summing(lengths):
    """Any caller of the server's check (not only the decoders) gets the element-wise bound."""
    n = sum(lengths) % 2**64
    arrays = FeatureArrays(
        batch_size=1,
        dense=torch.zeros(DENSE),
        keys=CATS,
        lengths=torch.tensor(np.array(lengths, dtype=np.uint64).astype(np.int64)),
        values=torch.ones(n, dtype=torch.int64),
    )
    schema = ModelSchema("m", "1", CATS, torch.full((26,), ROWS), DENSE, frozenset(), 64)
    with pytest.raises(
        InvalidRequestError, match=r"sparse.lengths: length 4611686018427387904 \(feature 'cat_0'"
    ):
        check_request(arrays, schema)


def _raw_call(server, method: str):
    channel = grpc.insecure_channel(target(server))
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


@pytest.mark.parametrize(
    ("method", "valid"),
    [
        ("/recserve.v1.Predictor/Predict", lambda: encode_predict_request(*random_batch(1))),
        ("/inference.GRPCInferenceService/ModelInfer", lambda: infer_request(*random_batch(1), True)),
    ],
    ids=["predictor", "oip"],
)  # fmt: skip
def test_undecodable_messages_are_invalid_argument_counted_and_logged_once(packages, caplog, method, valid):
    garbage = [
        b"\xff",
        b"\x0a\xff\xff\xff\xff\x0f",
        b"\x12\x05abc",
        bytes(range(256)),
        b"\x08" + b"\x80" * 11,
    ]
    with running_server(packages["1"], max_queue_delay_ms=1) as server:
        call = _raw_call(server, method)
        with caplog.at_level(logging.WARNING, logger="recserve.server.transports.handlers"):
            for data in garbage:
                with pytest.raises(grpc.RpcError) as info:
                    call(data, timeout=10)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "is not a valid" in info.value.details()
        assert call(valid().SerializeToString(), timeout=10)  # and the server still answers
        counted = scrape(server)["recserve_requests_total"]
    logged = [r for r in caplog.records if r.name == "recserve.server.transports.handlers"]
    assert len(logged) == 1 and "1 undecodable request(s)" in logged[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)
    assert counted[(("code", "INVALID_ARGUMENT"), ("method", method.lstrip("/")))] == len(garbage)


@pytest.fixture(scope="module")
def tiny_server(packages):
    with running_server(packages["1"], max_queue_delay_ms=1) as server:
        yield server


def _oip_mutations():
    def weights(r):
        r.inputs.add(name="f0.weights", datatype="FP32", shape=[len(r.raw_input_contents[2]) // 8])
        r.raw_input_contents.append(b"\x00\x00\x80\x3f" * (len(r.raw_input_contents[2]) // 8))

    def param(where, name, **value):
        def mutate(r):
            target_ = {"request": r, "input": r.inputs[1], "output": r.outputs.add(name="scores")}[where]
            target_.parameters[name].CopyFrom(oip_pb2.InferParameter(**value))

        return mutate

    def shape(i, dims):
        return lambda r: r.inputs[i].shape.__setitem__(slice(None), dims)

    return [
        ("weights_on_unweighted", weights, "inputs['f0.weights']: feature 'f0' is not weighted"),
        ("unknown_output", lambda r: r.outputs.add(name="probabilities"), "outputs['probabilities']"),
        ("output_twice", lambda r: [r.outputs.add(name="scores") for _ in range(2)], "requested twice"),
        ("priority_string", param("request", "priority", string_param="high"), "parameters['priority']"),
        ("timeout_negative", param("request", "timeout", int64_param=-5), "['timeout']: must be >= 0"),
        ("sequence_start_int", param("request", "sequence_start", int64_param=1), "expected bool_param"),
        ("shared_memory", param("input", "shared_memory_region", string_param="r"), "shared memory"),
        ("binary_data_str", param("output", "binary_data", string_param="y"), "outputs['scores'].parameters"),
        ("classification", param("output", "classification", int64_param=3), "classification"),
        ("shape_wraps_in_int64", shape(0, [2**32, 2**32]), "raw_input_contents['dense']"),
        ("negative_dims", shape(0, [-2, -4]), "negative dimension"),
        ("too_many_inputs", lambda r: [r.inputs.add(name=f"f{i}.x") for i in range(10)], "inputs: 17 inputs"),
        ("rank", lambda r: r.inputs[1].shape.append(1), "inputs['f0.lengths'].shape: expected [n]"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "mutate", "message"), _oip_mutations(), ids=[m[0] for m in _oip_mutations()]
)
def test_oip_inputs_the_model_does_not_have_are_invalid_argument(tiny_server, name, mutate, message):
    stub = oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(tiny_server)))
    req = infer_request(*random_batch(2, seed=5, max_ids=3), raw=True)
    mutate(req)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert message in info.value.details()


def test_oip_known_parameters_of_the_right_type_and_custom_ones_are_accepted(tiny_server):
    stub = oip_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(target(tiny_server)))
    req = infer_request(*random_batch(2, seed=5), raw=True)
    req.parameters["priority"].int64_param = 1
    req.parameters["sequence_id"].string_param = "abc"
    req.parameters["my_custom"].string_param = "anything"
    req.outputs.add(name="scores").parameters["binary_data"].bool_param = True
    assert list(stub.ModelInfer(req, timeout=10).outputs[0].shape) == [2]


def test_v1_weights_for_a_model_without_weighted_features_are_invalid_argument(tiny_server):
    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target(tiny_server)))
    dense, kjt = random_batch(2, seed=2)
    weighted = KeyedJaggedTensor(
        keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), weights=torch.ones(kjt.values().numel())
    )
    for raw in (True, False):
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(encode_predict_request(dense, weighted, raw=raw), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sparse.weights: feature 'f0' is not weighted in model 'tiny'" in info.value.details()
