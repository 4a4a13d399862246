"""``recserve.v1`` messages <-> tensors. Protobuf stays here and in the servicers; the core sees tensors."""

from __future__ import annotations

from torch import Tensor

from recserve.errors import InvalidRequestError
from recserve.server.dataplane.arrays import FeatureArrays, decode_array, encode_raw, from_raw
from recserve.server.transports.protos import pb2
from rectrain.sparse import KeyedJaggedTensor


def decode_predict_request(req: pb2.PredictRequest) -> FeatureArrays:
    """The request's arrays as tensors; only wire-level checks here (sizes come in :mod:`validation`)."""
    if req.batch_size < 0:
        raise InvalidRequestError(f"batch_size: must be >= 0, got {req.batch_size}")
    sp = req.sparse
    weights = None
    if len(sp.weights) or sp.weights_raw:
        weights = decode_array("sparse.weights", sp.weights, sp.weights_raw, "float32")
    return FeatureArrays(
        batch_size=req.batch_size,
        dense=decode_array("dense.data", req.dense.data, req.dense.raw, "float32"),
        keys=list(sp.keys),
        lengths=decode_array("sparse.lengths", sp.lengths, sp.lengths_raw, "int32"),
        values=decode_array("sparse.values", sp.values, sp.values_raw, "int64"),
        weights=weights,
        request_id=req.request_id,
    )


def encode_predict_request(
    dense: Tensor,
    kjt: KeyedJaggedTensor,
    *,
    request_id: str = "",
    raw: bool = True,
    model_name: str = "",
) -> pb2.PredictRequest:
    """A PredictRequest for ``dense`` ``[B, W]`` and ``kjt`` (B rows per key); raw bytes fields by default."""
    batch_size = int(dense.shape[0]) if dense.dim() == 2 else kjt.stride()
    req = pb2.PredictRequest(
        request_id=request_id, batch_size=batch_size, raw_output=raw, model_name=model_name
    )
    sp = req.sparse
    sp.keys.extend(kjt.keys())
    weights = kjt.weights_or_none()
    if raw:
        req.dense.raw = encode_raw(dense, "float32")
        sp.lengths_raw = encode_raw(kjt.lengths(), "int32")
        sp.values_raw = encode_raw(kjt.values(), "int64")
        if weights is not None:
            sp.weights_raw = encode_raw(weights, "float32")
    else:
        req.dense.data.extend(dense.reshape(-1).tolist())
        sp.lengths.extend(kjt.lengths().tolist())
        sp.values.extend(kjt.values().tolist())
        if weights is not None:
            sp.weights.extend(weights.tolist())
    return req


def scores_of(resp: pb2.PredictResponse) -> Tensor:
    """The float32 scores of a PredictResponse, whichever of its two fields carries them."""
    if resp.scores_raw:
        return from_raw(resp.scores_raw, "float32")
    return decode_array("scores", resp.scores, b"", "float32")


def set_scores(resp: pb2.PredictResponse, scores: Tensor, raw: bool) -> None:
    if raw:
        resp.scores_raw = encode_raw(scores, "float32")
    else:
        resp.scores.extend(scores.tolist())
