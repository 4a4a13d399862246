"""The recommendation pipeline as an Open Inference Protocol model (so that ``tritonclient`` can call it).

Inputs are the user's features, as a scoring model's (one example): ``dense`` FP32 [1, user_dense],
``<feature>.lengths`` INT32 [1] and ``<feature>.values`` INT64 [n] per user feature, and optionally
``exclude_item_ids`` INT64 [m] (never returned). Parameters ``k`` and ``num_candidates`` (int64; absent:
the pipeline's defaults). Outputs ``item_ids`` INT64 [K] and ``scores`` FP32 [K], best first.
"""

from __future__ import annotations

import time

import grpc
import torch

from recserve.errors import InvalidRequestError
from recserve.recommend.pipeline import UserRequest
from recserve.server.dataplane.arrays import encode_raw
from recserve.server.dataplane.recommend import RecommendResult, RecommendService
from recserve.server.transports.oip import (
    _decode_input,
    check_parameters,
    decode_infer_request,
    input_metadata,
    parameter_deadline,
)
from recserve.server.transports.protos import oip_pb2
from recserve.server.transports.servicer import request_deadline
from recserve.server.transports.triton_ext import PLATFORM

EXCLUDE_INPUT = "exclude_item_ids"
OUTPUTS = ("item_ids", "scores")
_OUTPUT_PARAMETERS = {"binary_data": ("bool_param",)}


def pipeline_metadata(service: RecommendService) -> oip_pb2.ModelMetadataResponse:
    s = service.schema
    resp = oip_pb2.ModelMetadataResponse(name=s.model_name, versions=[s.version], platform=PLATFORM)
    for name, dtype, shape in input_metadata(s):
        resp.inputs.add(name=name, datatype=dtype, shape=[1, shape[1]] if name == "dense" else shape)
    resp.inputs.add(name=EXCLUDE_INPUT, datatype="INT64", shape=[-1])
    resp.outputs.add(name="item_ids", datatype="INT64", shape=[-1])
    resp.outputs.add(name="scores", datatype="FP32", shape=[-1])
    return resp


def _int_parameter(req: oip_pb2.ModelInferRequest, name: str) -> int:
    if name not in req.parameters:
        return 0
    param = req.parameters[name]
    if param.WhichOneof("parameter_choice") != "int64_param":
        raise InvalidRequestError(f"parameters[{name!r}]: expected int64_param")
    return int(param.int64_param)


def _split_exclude(req: oip_pb2.ModelInferRequest) -> tuple[oip_pb2.ModelInferRequest, torch.Tensor]:
    """The request without its outputs and exclusions (what the feature decoder reads), and the exclusions."""
    for out in req.outputs:
        if out.name not in OUTPUTS:
            raise InvalidRequestError(
                f"outputs[{out.name!r}]: the pipeline has no such output (its outputs: {list(OUTPUTS)})"
            )
        check_parameters(f"outputs[{out.name!r}]", out.parameters, _OUTPUT_PARAMETERS)
    features = oip_pb2.ModelInferRequest()
    features.CopyFrom(req)
    del features.outputs[:]
    del features.inputs[:]
    del features.raw_input_contents[:]
    raws = list(req.raw_input_contents)
    if raws and len(raws) != len(req.inputs):
        raise InvalidRequestError(f"raw_input_contents: {len(raws)} entries for {len(req.inputs)} inputs")
    exclude = torch.zeros(0, dtype=torch.int64)
    for i, tensor in enumerate(req.inputs):
        if tensor.name == EXCLUDE_INPUT:
            if tensor.datatype != "INT64":
                raise InvalidRequestError(
                    f"inputs[{EXCLUDE_INPUT!r}].datatype: expected INT64, got {tensor.datatype!r}"
                )
            as_values = oip_pb2.ModelInferRequest.InferInputTensor()
            as_values.CopyFrom(tensor)
            as_values.name = "exclude.values"  # decoded as an id list: the same checks of shape and size
            exclude = _decode_input(as_values, raws[i] if raws else None, i)
            continue
        features.inputs.append(tensor)
        if raws:
            features.raw_input_contents.append(raws[i])
    return features, exclude


def decode_pipeline_request(
    service: RecommendService, req: oip_pb2.ModelInferRequest, received: float, deadline: float | None
) -> tuple[UserRequest, float | None]:
    """The checked user request of an OIP request to the pipeline, and its deadline."""
    features, exclude = _split_exclude(req)
    user = service.check(
        decode_infer_request(features, service.schema),
        k=_int_parameter(req, "k"),
        num_candidates=_int_parameter(req, "num_candidates"),
        exclude=exclude,
        model_name=req.model_name,
    )
    return user, parameter_deadline(req.parameters, received, deadline)


def pipeline_response(req: oip_pb2.ModelInferRequest, result: RecommendResult) -> oip_pb2.ModelInferResponse:
    """The reply: ``item_ids`` and ``scores`` (those asked for), raw when the request was raw."""
    rec = result.recommendation
    resp = oip_pb2.ModelInferResponse(
        model_name=result.model_name, model_version=result.model_version, id=req.id
    )
    for name in [o.name for o in req.outputs] or list(OUTPUTS):
        values = rec.item_ids if name == "item_ids" else rec.scores
        out = resp.outputs.add(
            name=name, datatype="INT64" if name == "item_ids" else "FP32", shape=[values.numel()]
        )
        if req.raw_input_contents:
            resp.raw_output_contents.append(encode_raw(values, "int64" if name == "item_ids" else "float32"))
        elif name == "item_ids":
            out.contents.int64_contents.extend(values.tolist())
        else:
            out.contents.fp32_contents.extend(values.tolist())
    return resp


def pipeline_infer(
    service: RecommendService, req: oip_pb2.ModelInferRequest, context: grpc.ServicerContext
) -> oip_pb2.ModelInferResponse:
    received = time.monotonic()
    user, deadline = decode_pipeline_request(service, req, received, request_deadline(context, received))
    return pipeline_response(req, service.recommend(user, deadline, received))


class PipelineModel:
    """The pipeline as the OIP service's model of its own name (what ``InferenceServicer`` calls)."""

    def __init__(self, service: RecommendService) -> None:
        self.service = service

    @property
    def model_name(self) -> str:
        return self.service.model_name

    def metadata(self) -> oip_pb2.ModelMetadataResponse:
        return pipeline_metadata(self.service)

    def infer(
        self, request: oip_pb2.ModelInferRequest, context: grpc.ServicerContext
    ) -> oip_pb2.ModelInferResponse:
        return pipeline_infer(self.service, request, context)
