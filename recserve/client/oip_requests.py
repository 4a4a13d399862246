"""Open Inference Protocol ``ModelInfer`` requests for the load generators, as Triton's clients send them.

The same random requests as :func:`recserve.client.loadgen.build_requests` (same seed, same draws), in the
OIP form: ``dense`` FP32 ``[B, W]``, per feature ``<f>.lengths`` INT32 ``[B]`` and ``<f>.values`` INT64
``[N]``, all in ``raw_input_contents``. ``leading_one`` prefixes every shape with a dimension of 1: a Triton
model repository written by ``recserve export --triton-repository`` batches requests (not examples), so each
request is one item of its batch there.
"""

from __future__ import annotations

import torch

from recserve.client.client import ServedModel
from recserve.server.dataplane.arrays import encode_raw
from recserve.server.transports.protos import OIP_SERVICE, oip_pb2
from rectrain.sparse import KeyedJaggedTensor

MODEL_INFER_METHOD = f"/{OIP_SERVICE}/ModelInfer"


def infer_request(
    model_name: str, dense: torch.Tensor, kjt: KeyedJaggedTensor, *, request_id: str = "", leading_one=False
) -> oip_pb2.ModelInferRequest:
    """A ModelInferRequest of ``dense`` ``[B, W]`` and ``kjt`` (B rows per key), raw little-endian tensors."""
    lead = [1] if leading_one else []
    req = oip_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    req.inputs.add(name="dense", datatype="FP32", shape=lead + list(dense.shape))
    req.raw_input_contents.append(encode_raw(dense, "float32"))
    for key, jt in kjt.to_dict().items():
        lengths, values = jt.lengths(), jt.values()
        req.inputs.add(name=f"{key}.lengths", datatype="INT32", shape=lead + [lengths.numel()])
        req.raw_input_contents.append(encode_raw(lengths, "int32"))
        req.inputs.add(name=f"{key}.values", datatype="INT64", shape=lead + [values.numel()])
        req.raw_input_contents.append(encode_raw(values, "int64"))
    req.outputs.add(name="scores")
    return req


def random_batch(
    model: ServedModel, batch: int, ids_per_feature: int, g: torch.Generator
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One random valid batch for ``model``: ids uniform inside each table, 1 .. 2 * mean - 1 per example."""
    lengths = torch.randint(1, 2 * ids_per_feature, (len(model.features) * batch,), generator=g)
    parts, start = [], 0
    for f in model.features:
        n = int(lengths[start : start + batch].sum())
        parts.append(torch.randint(0, f.num_embeddings, (n,), generator=g))
        start += batch
    kjt = KeyedJaggedTensor(
        keys=model.feature_names, values=torch.cat(parts), lengths=lengths, validate=False
    )
    return torch.randn(batch, model.dense_in_features, generator=g), kjt


def build_infer_requests(
    model: ServedModel,
    batch: int,
    count: int,
    ids_per_feature: int = 20,
    seed: int = 0,
    *,
    leading_one: bool = False,
) -> list[bytes]:
    """``count`` serialized ModelInferRequests of ``batch`` examples for ``model``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        dense, kjt = random_batch(model, batch, ids_per_feature, g)
        req = infer_request(model.model_name, dense, kjt, request_id=f"loadgen-{i}", leading_one=leading_one)
        out.append(req.SerializeToString())
    return out
