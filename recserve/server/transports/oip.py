"""Open Inference Protocol v2 (KServe / Triton ``inference.GRPCInferenceService``) over the same core.

The model's inputs, as ``ModelMetadata`` lists them (B = examples in the request, N = ids of the feature):

    dense              FP32  [B, dense_in_features]
    <feature>.lengths  INT32 [B]      ids per example (INT64 accepted too)
    <feature>.values   INT64 [N]      the ids, example after example (INT32 accepted too)
    <feature>.weights  FP32  [N]      optional, for weighted features

and one output ``scores`` FP32 [B]. Inputs come as typed ``contents`` or as ``raw_input_contents`` (one raw
entry per input, in input order); the reply uses the same form as the request.
"""

from __future__ import annotations

import math
import time

import grpc
import numpy as np
import torch
from torch import Tensor

import recserve
from recserve.errors import InvalidRequestError, ModelNotFoundError, UnavailableError
from recserve.server.dataplane.arrays import OIP_FIELDS, FeatureArrays, encode_raw
from recserve.server.dataplane.core import InferenceCore
from recserve.server.dataplane.parts import OipLayout, RequestParts
from recserve.server.dataplane.validation import ModelSchema, check_request, check_weighted
from recserve.server.operations.admin import AUTH_METADATA_KEY
from recserve.server.transports.protos import oip_pb2, oip_pb2_grpc
from recserve.server.transports.servicer import request_deadline
from recserve.server.transports.triton_ext import EXTENSIONS, PLATFORM, Repository, model_config

DENSE_INPUT = "dense"
SCORES_OUTPUT = "scores"
# datatype -> (little-endian numpy dtype, InferTensorContents field)
_DATATYPES = {
    "FP32": ("<f4", "fp32_contents"),
    "INT32": ("<i4", "int_contents"),
    "INT64": ("<i8", "int64_contents"),
}
# Parameters the Triton/KServe clients send, with the InferParameter field each must use.
_REQUEST_PARAMETERS = {
    "priority": ("uint64_param", "int64_param"),
    "timeout": ("int64_param",),
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "binary_data_output": ("bool_param",),
}
_INPUT_PARAMETERS = {"binary_data_size": ("int64_param",)}
_OUTPUT_PARAMETERS = {"binary_data": ("bool_param",)}
_SHARED_MEMORY = "shared memory is not supported; send the tensor in the request"
_UNSUPPORTED = {
    "shared_memory_region": _SHARED_MEMORY,
    "shared_memory_byte_size": _SHARED_MEMORY,
    "shared_memory_offset": _SHARED_MEMORY,
    "classification": "classification outputs are not supported; request 'scores' without it",
}
_ACCEPTED = {
    "dense": ("FP32",),
    "lengths": ("INT32", "INT64"),
    "values": ("INT64", "INT32"),
    "weights": ("FP32",),
}


def input_metadata(schema: ModelSchema) -> list[tuple[str, str, list[int]]]:
    """``(name, datatype, shape)`` of every input, in the order ModelMetadata lists them."""
    inputs = [(DENSE_INPUT, "FP32", [-1, schema.dense_in_features])]
    for f in schema.feature_names:
        inputs += [(f"{f}.lengths", "INT32", [-1]), (f"{f}.values", "INT64", [-1])]
        if f in schema.weighted_features:
            inputs.append((f"{f}.weights", "FP32", [-1]))
    return inputs


def _decode_input(tensor, raw: bytes | None, index: int) -> Tensor:
    role = tensor.name.rsplit(".", 1)[-1] if tensor.name != DENSE_INPUT else "dense"
    if role not in _ACCEPTED:
        raise InvalidRequestError(
            f"inputs[{tensor.name!r}]: unknown input (expected dense or <feature>.lengths/.values/.weights)"
        )
    if tensor.datatype not in _ACCEPTED[role]:
        raise InvalidRequestError(
            f"inputs[{tensor.name!r}].datatype: expected one of {_ACCEPTED[role]}, got {tensor.datatype!r}"
        )
    check_parameters(f"inputs[{tensor.name!r}]", tensor.parameters, _INPUT_PARAMETERS)
    count = _element_count(tensor, rank=2 if role == "dense" else 1)
    le, field = _DATATYPES[tensor.datatype]
    if raw is not None:
        if tensor.contents.ByteSize():
            raise InvalidRequestError(
                f"inputs[{tensor.name!r}]: given both as contents and in raw_input_contents; send one"
            )
        itemsize = np.dtype(le).itemsize
        if len(raw) != count * itemsize:
            raise InvalidRequestError(
                f"raw_input_contents[{tensor.name!r}]: {len(raw)} bytes, expected {count} x {itemsize} "
                f"for shape {list(tensor.shape)}"
            )
        arr = np.frombuffer(raw, dtype=le).astype(le[1:])
    else:
        _check_contents_fields(tensor, index, field)
        arr = np.asarray(getattr(tensor.contents, field), dtype=le[1:])
        if arr.size != count:
            raise InvalidRequestError(
                f"inputs[{tensor.name!r}].contents: {arr.size} elements for shape {list(tensor.shape)}"
            )
    return torch.from_numpy(arr)


def _check_contents_fields(tensor, index: int, field: str) -> None:
    """Typed contents hold only the field of the input's datatype: another one would be ignored, so a
    client that fills the wrong field (or two) would be scored on data it did not mean to send."""
    for descriptor, _ in tensor.contents.ListFields():  # the non-empty fields only
        if descriptor.name != field:
            raise InvalidRequestError(
                f"inputs[{index}] ({tensor.name!r}): {descriptor.name} given for datatype "
                f"{tensor.datatype}; only {field}"
            )


def _element_count(tensor, rank: int) -> int:
    """The shape's element count, each dimension checked first: ``np.prod`` of int64 dims wraps silently
    (``[2**32, 2**32]`` is 0 elements to it), and two negative dims multiply to a positive count."""
    shape = list(tensor.shape)
    if len(shape) != rank:
        expected = "[batch, dense_in_features]" if rank == 2 else "[n]"
        raise InvalidRequestError(f"inputs[{tensor.name!r}].shape: expected {expected}, got {shape}")
    if min(shape) < 0:
        raise InvalidRequestError(f"inputs[{tensor.name!r}].shape: negative dimension in {shape}")
    return math.prod(shape)  # Python ints: exact, then compared with the data actually sent


def check_outputs(req: oip_pb2.ModelInferRequest) -> None:
    """Requested outputs must be ones the model has (Triton rejects the others), each asked for once."""
    seen = set()
    for out in req.outputs:
        if out.name != SCORES_OUTPUT:
            raise InvalidRequestError(
                f"outputs[{out.name!r}]: the model has no such output (its outputs: [{SCORES_OUTPUT!r}])"
            )
        if out.name in seen:
            raise InvalidRequestError(f"outputs[{out.name!r}]: requested twice")
        seen.add(out.name)
        check_parameters(f"outputs[{out.name!r}]", out.parameters, _OUTPUT_PARAMETERS)


def check_parameters(where: str, parameters, known: dict[str, tuple[str, ...]]) -> None:
    """Parameters Triton defines must carry the type it defines; features recserve lacks (shared memory,
    classification) are refused; other names pass, as Triton hands custom parameters to its backends."""
    for name, param in parameters.items():
        if name in _UNSUPPORTED:
            raise InvalidRequestError(f"{where}.parameters[{name!r}]: {_UNSUPPORTED[name]}")
        if name not in known:
            continue
        kind = param.WhichOneof("parameter_choice")
        if kind not in known[name]:
            raise InvalidRequestError(
                f"{where}.parameters[{name!r}]: expected {' or '.join(known[name])}, got {kind or 'no value'}"
            )
        if kind == "int64_param" and param.int64_param < 0:
            raise InvalidRequestError(f"{where}.parameters[{name!r}]: must be >= 0, got {param.int64_param}")


def named(field: str, name: str) -> str:
    """``name``, unless it is empty: every OIP call that addresses a model must name it (Triton's rule)."""
    if not name:
        raise InvalidRequestError(f"{field}: empty; name the model (the server's ModelMetadata / index)")
    return name


def parameter_deadline(parameters, received: float, deadline: float | None = None) -> float | None:
    """The earlier of ``deadline`` and the request's ``timeout`` parameter (Triton's: microseconds after
    ``received``, 0 meaning none), as a ``time.monotonic()`` instant."""
    if "timeout" not in parameters or parameters["timeout"].int64_param <= 0:
        return deadline
    own = received + parameters["timeout"].int64_param / 1e6
    return own if deadline is None else min(own, deadline)


def decode_infer_request(req: oip_pb2.ModelInferRequest, schema: ModelSchema) -> FeatureArrays:
    """Named OIP inputs → the key-major arrays of one KJT plus the dense matrix."""
    check_parameters("parameters", req.parameters, _REQUEST_PARAMETERS)
    check_outputs(req)
    most = 1 + 3 * len(schema.feature_names)  # dense, then lengths, values and weights per feature
    if len(req.inputs) > most:
        raise InvalidRequestError(
            f"inputs: {len(req.inputs)} inputs; model {schema.model_name!r} has {most} at most"
        )
    raws = list(req.raw_input_contents)
    if raws and len(raws) != len(req.inputs):
        raise InvalidRequestError(f"raw_input_contents: {len(raws)} entries for {len(req.inputs)} inputs")
    tensors = {}
    for i, t in enumerate(req.inputs):
        if t.name in tensors:
            raise InvalidRequestError(f"inputs[{t.name!r}]: given twice")
        tensors[t.name] = (t, _decode_input(t, raws[i] if raws else None, i))
    if DENSE_INPUT in tensors:
        shape = list(tensors[DENSE_INPUT][0].shape)
        batch = shape[0]
        if shape[1] != schema.dense_in_features:
            raise InvalidRequestError(
                f"inputs['dense'].shape: expected [batch, {schema.dense_in_features}], got {shape}"
            )
    else:
        lengths = [t for name, (t, _) in tensors.items() if name.endswith(".lengths")]
        batch = lengths[0].shape[0] if lengths else 0
    dense = tensors.pop(DENSE_INPUT, (None, torch.zeros(0)))[1]
    features = [n[: -len(".lengths")] for n in tensors if n.endswith(".lengths")]
    orphans = [n for n in tensors if n.rsplit(".", 1)[0] not in features]
    if orphans:
        raise InvalidRequestError(f"inputs[{orphans[0]!r}]: no matching '<feature>.lengths' input")
    lengths, values, weights = [], [], []
    for f in features:
        if f"{f}.values" not in tensors:
            raise InvalidRequestError(f"inputs: {f + '.lengths'!r} given without {f + '.values'!r}")
        lengths.append(_feature_lengths(f, tensors[f"{f}.lengths"][1], batch))
        values.append(tensors[f"{f}.values"][1].to(torch.int64))
        if f"{f}.weights" in tensors:
            weights.append(_feature_weights(f, tensors[f"{f}.weights"][1], values[-1]))
    if weights:
        check_weighted([f for f in features if f"{f}.weights" in tensors], schema, OIP_FIELDS)
    if weights and len(weights) != len(features):
        raise InvalidRequestError("inputs: give '<feature>.weights' for every feature or for none")
    return FeatureArrays(
        batch_size=batch,
        dense=dense.to(torch.float32),
        keys=features,
        lengths=torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.int64),
        values=torch.cat(values) if values else torch.zeros(0, dtype=torch.int64),
        weights=torch.cat(weights) if weights else None,
        request_id=req.id,
        counts=[v.numel() for v in values],
        fields=OIP_FIELDS,
    )


def decode_batchable(
    req: oip_pb2.ModelInferRequest, schema: ModelSchema, layout: OipLayout
) -> FeatureArrays | RequestParts:
    """The usual request (raw tensors, an unweighted model's inputs) as parts, checked with its batch;
    anything else decoded by :func:`decode_infer_request`, which names what is wrong."""
    check_parameters("parameters", req.parameters, _REQUEST_PARAMETERS)
    check_outputs(req)
    parts = layout.parts(req, lambda s: check_request(decode_infer_request(req, s), s))
    return parts if parts is not None else decode_infer_request(req, schema)


def _feature_lengths(feature: str, lengths: Tensor, batch: int) -> Tensor:
    """One feature's lengths, one per example (their values are checked with the others')."""
    if lengths.numel() != batch:
        name = f"{feature}.lengths"
        raise InvalidRequestError(f"inputs[{name!r}]: {lengths.numel()} entries for {batch} examples")
    return lengths.to(torch.int64)


def _feature_weights(feature: str, weights: Tensor, values: Tensor) -> Tensor:
    """One feature's weights, one per id it sent (checked here: the wire sends each feature's apart)."""
    if weights.numel() != values.numel():
        name = f"{feature}.weights"
        raise InvalidRequestError(f"inputs[{name!r}]: {weights.numel()} weights for {values.numel()} values")
    return weights


class InferenceServicer(oip_pb2_grpc.GRPCInferenceServiceServicer):
    """The OIP v2 service: health, metadata and ModelInfer over :class:`InferenceCore`, plus Triton's model
    configuration, statistics and repository extensions (:mod:`recserve.server.transports.triton_ext`)."""

    def __init__(
        self, core: InferenceCore, repository: Repository, *, device: str = "cpu", pipeline=None
    ) -> None:
        self._core = core
        self._repository = repository
        self._device = device
        # A recommendation pipeline served beside the model, under its own name
        # (recserve.server.transports.oip_recommend.PipelineModel: metadata(), infer(request, context)).
        self._pipeline_model = pipeline

    def _pipeline(self, name: str):
        model = self._pipeline_model
        return model if model is not None and name and name == model.model_name else None

    def ServerLive(self, request, context):
        return oip_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return oip_pb2.ServerReadyResponse(ready=self._core.ready)

    def ModelReady(self, request, context):
        named("name", request.name)
        if self._pipeline(request.name) is not None:
            return oip_pb2.ModelReadyResponse(ready=self._core.ready)
        try:
            self._core.find(request.name, request.version)
        except (ModelNotFoundError, UnavailableError):
            return oip_pb2.ModelReadyResponse(ready=False)
        return oip_pb2.ModelReadyResponse(ready=self._core.ready)

    def ServerMetadata(self, request, context):
        return oip_pb2.ServerMetadataResponse(
            name="recserve", version=recserve.__version__, extensions=list(EXTENSIONS)
        )

    def ModelMetadata(self, request, context):
        if self._pipeline(request.name) is not None:
            return self._pipeline(request.name).metadata()
        s = self._core.find(named("name", request.name), request.version).schema
        resp = oip_pb2.ModelMetadataResponse(name=s.model_name, versions=[s.version], platform=PLATFORM)
        for name, dtype, shape in input_metadata(s):
            resp.inputs.add(name=name, datatype=dtype, shape=shape)
        resp.outputs.add(name=SCORES_OUTPUT, datatype="FP32", shape=[-1])
        return resp

    def ModelInfer(self, request: oip_pb2.ModelInferRequest, context: grpc.ServicerContext):
        if self._pipeline(request.model_name) is not None:
            return self._pipeline(request.model_name).infer(request, context)
        received = time.monotonic()
        runner = self._core.find(named("model_name", request.model_name), request.model_version)
        arrays = decode_batchable(request, runner.schema, runner.oip_layout)
        result = self._core.infer(
            arrays,
            deadline=parameter_deadline(request.parameters, received, request_deadline(context, received)),
            model_name=request.model_name,
            model_version=request.model_version,
            received=received,
        )
        resp = oip_pb2.ModelInferResponse(
            model_name=result.model_name, model_version=result.model_version, id=request.id
        )
        out = resp.outputs.add(name=SCORES_OUTPUT, datatype="FP32", shape=[result.scores.numel()])
        if request.raw_input_contents:
            resp.raw_output_contents.append(encode_raw(result.scores, "float32"))
        else:
            out.contents.fp32_contents.extend(result.scores.tolist())
        return resp

    def ModelConfig(self, request, context):
        runner = self._core.find(named("name", request.name), request.version)
        return oip_pb2.ModelConfigResponse(
            config=model_config(runner, input_metadata(runner.schema), self._device)
        )

    def ModelStatistics(self, request, context):
        resp = oip_pb2.ModelStatisticsResponse()
        if not request.name and not self._core.current:
            return resp  # every model: none is loaded
        runner = self._core.find(request.name, request.version)
        resp.model_stats.append(self._repository.statistics(runner))
        return resp

    def RepositoryIndex(self, request, context):
        return oip_pb2.RepositoryIndexResponse(models=self._repository.index(request.ready))

    def RepositoryModelLoad(self, request, context):
        self._repository.load(request.model_name, request.parameters, _authorization(context))
        return oip_pb2.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request, context):
        self._repository.unload(request.model_name, request.parameters, _authorization(context))
        return oip_pb2.RepositoryModelUnloadResponse()


def _authorization(context: grpc.ServicerContext) -> str | None:
    return dict(context.invocation_metadata() or ()).get(AUTH_METADATA_KEY)
