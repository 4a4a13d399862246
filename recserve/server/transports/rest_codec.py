"""Open Inference Protocol REST bodies <-> the OIP gRPC messages, so that both transports share one decoder.

A REST infer body is JSON (``{"id", "parameters", "inputs": [{"name", "shape", "datatype", "data" |
"parameters": {"binary_data_size": n}}], "outputs": [...]}``), optionally followed by the binary-tensor
extension's raw bytes: the ``Inference-Header-Content-Length`` header says how many leading bytes are JSON,
and each input with ``binary_data_size`` takes that many of the bytes after it, in input order. Either way
every input becomes one ``raw_input_contents`` entry of a ``ModelInferRequest``, which
:func:`oip.decode_infer_request` then checks and decodes exactly as for gRPC. What only exists in JSON (the
structure, the ``data`` lists, the binary sizes) is checked here, naming the field.
"""

from __future__ import annotations

import json
import math

import numpy as np
from google.protobuf.descriptor import FieldDescriptor

from recserve.errors import InvalidRequestError
from recserve.server.transports.protos import oip_pb2

HEADER_LENGTH = "Inference-Header-Content-Length"
TOO_DEEP = "request body: JSON nested too deeply to parse"
# datatype -> (little-endian numpy dtype, numpy kinds its JSON numbers may have, smallest, largest)
_JSON_TYPES = {
    "FP32": ("<f4", "iuf", None, None),
    "INT32": ("<i4", "iu", -(2**31), 2**31 - 1),
    "INT64": ("<i8", "iu", -(2**63), 2**63 - 1),
}


def split_body(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    """The JSON document and the binary bytes after it (none without the header)."""
    if header_length is None:
        n = len(body)
    else:
        try:
            n = int(header_length)
        except ValueError:
            n = -1
        if not 0 <= n <= len(body):
            raise InvalidRequestError(
                f"{HEADER_LENGTH}: {header_length!r} is not a length within the {len(body)}-byte body"
            )
    try:
        doc = json.loads(body[:n])
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"request body: not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidRequestError(TOO_DEEP) from None
    if not isinstance(doc, dict):
        raise InvalidRequestError("request body: expected a JSON object with 'inputs'")
    return doc, body[n:]


def infer_request(doc: dict, binary: bytes, model_name: str, model_version: str) -> oip_pb2.ModelInferRequest:
    """The ``ModelInferRequest`` a REST infer body stands for (every input as raw bytes)."""
    req = oip_pb2.ModelInferRequest(model_name=model_name, model_version=model_version)
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidRequestError(f"id: expected a string, got {type(request_id).__name__}")
    req.id = request_id
    _set_parameters("parameters", req.parameters, doc.get("parameters", {}))
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidRequestError("inputs: expected a non-empty list of input tensors")
    offset = 0
    for i, tensor in enumerate(inputs):
        raw, used = _input(i, tensor, binary, offset, req)
        req.raw_input_contents.append(raw)
        offset += used
    if offset != len(binary):
        raise InvalidRequestError(
            f"{HEADER_LENGTH}: {len(binary) - offset} binary bytes after the JSON belong to no input "
            "(the inputs' binary_data_size add up to less)"
        )
    outputs = doc.get("outputs", [])
    if not isinstance(outputs, list):
        raise InvalidRequestError("outputs: expected a list")
    for i, out in enumerate(outputs):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise InvalidRequestError(f"outputs[{i}]: expected an object with a string 'name'")
        o = req.outputs.add(name=out["name"])
        _set_parameters(f"outputs[{out['name']!r}].parameters", o.parameters, out.get("parameters", {}))
    return req


def _input(i: int, tensor, binary: bytes, offset: int, req) -> tuple[bytes, int]:
    """One input: adds its metadata to ``req``; returns its raw bytes and how many binary bytes it used."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise InvalidRequestError(f"inputs[{i}]: expected an object with a string 'name'")
    name = tensor["name"]
    where = f"inputs[{name!r}]"
    datatype, shape = tensor.get("datatype"), tensor.get("shape")
    if not isinstance(datatype, str) or datatype not in _JSON_TYPES:
        raise InvalidRequestError(
            f"{where}.datatype: expected one of {sorted(_JSON_TYPES)}, got {repr(datatype)[:80]}"
        )
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**63 for d in shape):
        raise InvalidRequestError(
            f"{where}.shape: expected a list of int64 dimensions >= 0, got {repr(shape)[:80]}"
        )
    t = req.inputs.add(name=name, datatype=datatype, shape=shape)
    params = tensor.get("parameters", {})
    _set_parameters(f"{where}.parameters", t.parameters, params)
    size = params.get("binary_data_size")
    if size is not None and (type(size) is not int or size < 0):
        raise InvalidRequestError(
            f"inputs[{i}].parameters.binary_data_size ({name!r}): must be an integer byte count >= 0, "
            f"got {repr(size)[:40]}"
        )
    le, kinds, lo, hi = _JSON_TYPES[datatype]
    nbytes = math.prod(shape) * np.dtype(le).itemsize
    if "binary_data_size" in t.parameters:
        if "data" in tensor:
            raise InvalidRequestError(
                f"{where}: given both as 'data' and as binary_data_size bytes after the JSON; send one"
            )
        size = t.parameters["binary_data_size"].int64_param
        if size != nbytes:
            raise InvalidRequestError(
                f"{where}.parameters.binary_data_size: {size} bytes, expected {nbytes} for {datatype} {shape}"
            )
        if offset + size > len(binary):
            raise InvalidRequestError(
                f"{where}.parameters.binary_data_size: {size} bytes, but only {len(binary) - offset} "
                "binary bytes are left after the JSON"
            )
        return binary[offset : offset + size], size
    if "data" not in tensor:
        raise InvalidRequestError(f"{where}: give 'data' or parameters.binary_data_size")
    return _json_data(where, tensor["data"], shape, le, kinds, lo, hi), 0


def _json_data(where: str, data, shape: list[int], le: str, kinds: str, lo, hi) -> bytes:
    """A JSON ``data`` list (flat or nested, row-major) as little-endian bytes, its numbers checked first."""
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError, RecursionError):
        raise InvalidRequestError(f"{where}.data: not a (nested) list of numbers") from None
    if arr.size and (arr.dtype.kind not in kinds or arr.dtype == np.bool_):  # [] is float64 to numpy
        wanted = "integers" if kinds == "iu" else "numbers"
        raise InvalidRequestError(f"{where}.data: expected {wanted}, got {arr.dtype.kind!r} ({arr.dtype})")
    if arr.size != math.prod(shape):
        raise InvalidRequestError(f"{where}.data: {arr.size} elements for shape {shape}")
    if lo is not None and arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        raise InvalidRequestError(f"{where}.data: a value outside [{lo}, {hi}]")
    return arr.astype(le).tobytes()


def _set_parameters(where: str, target, params) -> None:
    """JSON parameters into an InferParameter map: bool, int, string or float values."""
    if not isinstance(params, dict):
        raise InvalidRequestError(f"{where}: expected an object")
    for key, value in params.items():
        p = target[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise InvalidRequestError(f"{where}[{key!r}]: {value} does not fit in int64")
            p.int64_param = value
        elif isinstance(value, str):
            p.string_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            raise InvalidRequestError(f"{where}[{key!r}]: expected a bool, integer, string or number")


_OUTPUT_DTYPES = {"FP32": "<f4", "INT64": "<i8", "INT32": "<i4"}


def infer_response(resp: oip_pb2.ModelInferResponse, binary: bool) -> tuple[bytes, dict[str, str]]:
    """A REST body (and its headers) for a gRPC ModelInferResponse whose outputs carry raw bytes."""
    outputs, tail = [], []
    for out, raw in zip(resp.outputs, resp.raw_output_contents):
        entry = {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}
        if binary:
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        else:
            entry["data"] = np.frombuffer(raw, dtype=_OUTPUT_DTYPES[out.datatype]).tolist()
        outputs.append(entry)
    doc = {"model_name": resp.model_name, "model_version": resp.model_version, "outputs": outputs}
    if resp.id:
        doc["id"] = resp.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not binary:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(tail), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}


def wants_binary(req: oip_pb2.ModelInferRequest) -> bool:
    """Binary output when the request says ``binary_data_output`` or an output says ``binary_data``."""
    if "binary_data_output" in req.parameters and req.parameters["binary_data_output"].bool_param:
        return True
    return any("binary_data" in o.parameters and o.parameters["binary_data"].bool_param for o in req.outputs)


def message_json(msg) -> dict:
    """A protobuf message as Triton's REST API writes it: field names as in the .proto, 64-bit integers as
    JSON numbers (``MessageToDict`` writes them as strings), enums by name."""
    out = {}
    for field, value in msg.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value(value_field, v) for k, v in value.items()}
        elif _repeated(field):
            out[field.name] = [_value(field, v) for v in value]
        else:
            out[field.name] = _value(field, value)
    return out


def _repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 6.31; ``label`` is gone from protobuf 7
    return field.label == FieldDescriptor.LABEL_REPEATED if flag is None else flag


def _value(field, value):
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.decode("latin-1")
    return value
