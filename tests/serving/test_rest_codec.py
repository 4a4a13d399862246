"""The REST body decoder on arbitrary JSON: a clear InvalidRequestError or a request, never anything else."""

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recserve.errors import InvalidRequestError
from recserve.server.dataplane.validation import ModelSchema, check_request
from recserve.server.transports.oip import decode_infer_request
from recserve.server.transports.rest_codec import infer_request, message_json, split_body

SCHEMA = ModelSchema(
    model_name="tiny",
    version="1",
    feature_names=["f0", "f1"],
    num_embeddings=torch.tensor([10, 20]),
    dense_in_features=2,
    weighted_features=frozenset(),
    max_batch_size=64,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)
names = st.sampled_from(["dense", "f0.lengths", "f0.values", "f1.lengths", "f1.values", "f2.values", "x"])
datatypes = st.sampled_from(["FP32", "INT32", "INT64", "BYTES", None])
shapes = st.lists(st.integers(-2, 6), max_size=3) | json_values
data = st.lists(st.integers(-5, 30), max_size=12) | st.lists(st.floats(-3, 3), max_size=12) | json_values


@st.composite
def documents(draw):
    inputs = draw(
        st.lists(
            st.fixed_dictionaries(
                {"name": names, "datatype": datatypes, "shape": shapes},
                optional={"data": data, "parameters": st.dictionaries(st.text(max_size=20), json_values)},
            ),
            max_size=6,
        )
        | json_values
    )
    doc = {"inputs": inputs}
    if draw(st.booleans()):
        doc["parameters"] = draw(st.dictionaries(st.text(max_size=20), json_values, max_size=3))
    if draw(st.booleans()):
        doc["outputs"] = draw(
            st.lists(st.fixed_dictionaries({"name": st.text(max_size=8)}), max_size=2) | json_values
        )
    return doc


def _decode(body: bytes, header: str | None) -> None:
    doc, binary = split_body(body, header)
    req = infer_request(doc, binary, "tiny", "")
    check_request(decode_infer_request(req, SCHEMA), SCHEMA)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents(), tail=st.binary(max_size=24), header=st.none() | st.integers(-3, 400).map(str))
def test_any_body_is_decoded_or_refused_with_invalid_request(doc, tail, header):
    body = json.dumps(doc).encode() + (tail if header is not None else b"")
    try:
        _decode(body, header)
    except InvalidRequestError as exc:
        assert str(exc)  # names what is wrong


def test_a_valid_mixed_json_and_binary_body_decodes_to_the_sent_arrays():
    dense = np.array([[0.5, -1.0], [2.0, 0.25]], dtype="<f4")
    values = np.array([1, 2, 3], dtype="<i8")
    doc = {
        "inputs": [
            {"name": "dense", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}},
            {"name": "f0.lengths", "datatype": "INT32", "shape": [2], "data": [2, 1]},
            {"name": "f0.values", "datatype": "INT64", "shape": [3], "parameters": {"binary_data_size": 24}},
            {"name": "f1.lengths", "datatype": "INT32", "shape": [2], "data": [[0], [1]]},
            {"name": "f1.values", "datatype": "INT64", "shape": [1], "data": [19]},
        ]
    }
    head = json.dumps(doc).encode()
    parsed, binary = split_body(head + dense.tobytes() + values.tobytes(), str(len(head)))
    arrays = decode_infer_request(infer_request(parsed, binary, "tiny", ""), SCHEMA)
    assert arrays.batch_size == 2 and arrays.keys == ["f0", "f1"]
    assert arrays.dense.tolist() == dense.reshape(-1).tolist()
    assert arrays.values.tolist() == [1, 2, 3, 19] and arrays.lengths.tolist() == [2, 1, 0, 1]


@pytest.mark.parametrize("header", ["x", "-1", "999"])
def test_a_bad_header_length_is_named(header):
    with pytest.raises(InvalidRequestError, match="Inference-Header-Content-Length"):
        split_body(b"{}", header)


def test_message_json_writes_64_bit_integers_as_numbers():
    from recserve.server.transports.protos import oip_pb2

    stats = oip_pb2.ModelStatistics(name="m", inference_count=2**40)
    stats.inference_stats.queue.ns = 7
    assert message_json(stats) == {
        "name": "m",
        "inference_count": 2**40,
        "inference_stats": {"queue": {"ns": 7}},
    }
