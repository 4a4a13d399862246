"""``recserve.v1`` Predictor service: a thin adapter from protobuf to :class:`InferenceCore`."""

from __future__ import annotations

import time

import grpc

from recserve.errors import UnavailableError
from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.core import InferenceCore, InferenceResult
from recserve.server.dataplane.parts import RequestParts, v1_parts
from recserve.server.dataplane.recommend import RecommendResult, RecommendService
from recserve.server.dataplane.validation import ModelSchema, check_request
from recserve.server.transports.codec import decode_predict_request, set_scores
from recserve.server.transports.protos import pb2, pb2_grpc

# grpc reports "no deadline" as a huge remaining time rather than None on some versions.
_NO_DEADLINE_SECONDS = 1e8


def request_deadline(context: grpc.ServicerContext, received: float) -> float | None:
    """The RPC's deadline as a ``time.monotonic()`` instant, or None when the client set none."""
    remaining = context.time_remaining()
    if remaining is None or remaining > _NO_DEADLINE_SECONDS:
        return None
    return received + remaining


def decode_batchable(request: pb2.PredictRequest, schema: ModelSchema) -> FeatureArrays | RequestParts:
    """The usual request as parts (checked with its batch), anything else decoded to be checked now."""
    parts = v1_parts(request, schema, lambda s: check_request(decode_predict_request(request), s))
    return parts if parts is not None else decode_predict_request(request)


def predict_response(
    request: pb2.PredictRequest, result: InferenceResult, received: float
) -> pb2.PredictResponse:
    """The reply to ``request``, scored as ``result``; ``received`` is its ``time.monotonic()`` arrival."""
    resp = pb2.PredictResponse(
        request_id=request.request_id, model_name=result.model_name, model_version=result.model_version
    )
    set_scores(resp, result.scores, request.raw_output)
    t = resp.timings
    t.queue_seconds = result.queue_seconds
    t.inference_seconds = result.inference_seconds
    t.executed_batch_size = result.executed_batch_size
    t.server_seconds = time.monotonic() - received
    return resp


def decode_recommend_request(request: pb2.RecommendRequest) -> FeatureArrays:
    """The user's features as one example, decoded as a PredictRequest's (the same named errors)."""
    as_predict = pb2.PredictRequest(request_id=request.request_id, batch_size=1)
    as_predict.dense.CopyFrom(request.dense)
    as_predict.sparse.CopyFrom(request.sparse)
    return decode_predict_request(as_predict)


def recommend_response(
    request: pb2.RecommendRequest, result: RecommendResult, received: float
) -> pb2.RecommendResponse:
    rec = result.recommendation
    resp = pb2.RecommendResponse(
        request_id=request.request_id,
        model_name=result.model_name,
        model_version=result.model_version,
        item_ids=rec.item_ids.tolist(),
        scores=rec.scores.tolist(),
        candidates=rec.candidates,
    )
    t = resp.timings
    t.queue_seconds = result.queue_seconds
    t.inference_seconds = result.inference_seconds
    t.executed_batch_size = result.executed_batch_size
    t.server_seconds = time.monotonic() - received
    return resp


class PredictorServicer(pb2_grpc.PredictorServicer):
    def __init__(self, core: InferenceCore, recommender: RecommendService | None = None) -> None:
        self._core = core
        self._recommender = recommender

    def Recommend(
        self, request: pb2.RecommendRequest, context: grpc.ServicerContext
    ) -> pb2.RecommendResponse:
        received = time.monotonic()
        if self._recommender is None:
            raise UnavailableError(
                "Recommend: this server serves no recommendation pipeline (see docs/recommend.md)"
            )
        user = self._recommender.check(
            decode_recommend_request(request),
            k=request.k,
            num_candidates=request.num_candidates,
            exclude=list(request.exclude_item_ids),
            model_name=request.model_name,
        )
        result = self._recommender.recommend(user, request_deadline(context, received), received)
        return recommend_response(request, result, received)

    def Predict(self, request: pb2.PredictRequest, context: grpc.ServicerContext) -> pb2.PredictResponse:
        received = time.monotonic()
        arrays = decode_batchable(request, self._core.find(request.model_name).schema)
        result = self._core.infer(
            arrays,
            deadline=request_deadline(context, received),
            model_name=request.model_name,
            received=received,
        )
        return predict_response(request, result, received)

    def ModelMetadata(self, request, context: grpc.ServicerContext) -> pb2.ModelMetadataResponse:
        runner = self._core.runner
        s = runner.schema
        dtypes = runner.feature_dtypes
        resp = pb2.ModelMetadataResponse(
            model_name=s.model_name,
            model_version=s.version,
            dense_in_features=s.dense_in_features,
            max_batch_size=s.max_batch_size,
        )
        for name, n in zip(s.feature_names, s.num_embeddings.tolist()):
            resp.sparse_features.add(
                name=name, num_embeddings=n, weighted=name in s.weighted_features, dtype=dtypes.get(name, "")
            )
        return resp
