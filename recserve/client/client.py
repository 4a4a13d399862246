"""``PredictorClient``: scores from a recserve server, from tensors or from plain Python lists.

    with PredictorClient("127.0.0.1:50051") as client:
        scores = client.predict(dense, kjt)                                  # Tensor [B]
        scores = client.predict_lists([[0.1] * 13], {"f0": [[3, 7]], ...})  # list[float]

Errors from the server surface as ``grpc.RpcError`` (``.code()`` is INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
DEADLINE_EXCEEDED, UNAVAILABLE ...; ``.details()`` names the offending field).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from torch import Tensor

from recserve.server.transports.codec import encode_predict_request, scores_of
from recserve.server.transports.protos import pb2, pb2_grpc
from rectrain.sparse import KeyedJaggedTensor

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class SparseFeatureInfo:
    name: str
    num_embeddings: int
    weighted: bool
    dtype: str


@dataclass(frozen=True)
class ServedModel:
    """What ``ModelMetadata`` reports: enough to build valid requests."""

    model_name: str
    version: str
    dense_in_features: int
    features: list[SparseFeatureInfo]
    max_batch_size: int

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]


def kjt_from_lists(sparse: dict[str, list[list[int]]], weights: dict[str, list[list[float]]] | None = None):
    """A KeyedJaggedTensor from ``{feature: [ids of example 0, ids of example 1, ...]}``."""
    keys = list(sparse)
    rows = [row for k in keys for row in sparse[k]]
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
    values = torch.tensor([i for r in rows for i in r], dtype=torch.int64)
    w = None
    if weights is not None:
        w = torch.tensor([x for k in keys for r in weights[k] for x in r], dtype=torch.float32)
    return KeyedJaggedTensor(keys=keys, values=values, weights=w, lengths=lengths)


class PredictorClient:
    """A channel to one server (``"host:port"``); thread-safe, reuse it for every call."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = 30.0,
        root_certificates: Path | bytes | None = None,
        client_key: Path | bytes | None = None,
        client_cert: Path | bytes | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        raw: bool = True,
    ) -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self._channel = open_channel(target, root_certificates, client_key, client_cert, options)
        self.target = target
        self.timeout = timeout
        self.raw = raw
        self._predictor = pb2_grpc.PredictorStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def predict(
        self, dense: Tensor, kjt: KeyedJaggedTensor, *, timeout: float | None = None, request_id: str = ""
    ) -> Tensor:
        """Scores ``[B]`` float32 for ``dense`` ``[B, W]`` and ``kjt`` (B rows per key)."""
        return scores_of(self.predict_response(dense, kjt, timeout=timeout, request_id=request_id))

    def predict_response(
        self, dense: Tensor, kjt: KeyedJaggedTensor, *, timeout: float | None = None, request_id: str = ""
    ) -> pb2.PredictResponse:
        """The whole reply: scores, model name and version, server-side timings."""
        req = encode_predict_request(dense, kjt, request_id=request_id, raw=self.raw)
        return self._predictor.Predict(req, timeout=self._timeout(timeout))

    def predict_lists(
        self,
        dense: list[list[float]],
        sparse: dict[str, list[list[int]]],
        *,
        weights: dict[str, list[list[float]]] | None = None,
        timeout: float | None = None,
    ) -> list[float]:
        """Scores from plain lists: ``dense`` one row per example, ``sparse`` one id list per example."""
        batch = len(dense) if dense else len(next(iter(sparse.values()), []))
        dense_t = torch.tensor(dense, dtype=torch.float32).reshape(batch, -1)
        return self.predict(dense_t, kjt_from_lists(sparse, weights), timeout=timeout).tolist()

    def metadata(self, *, timeout: float | None = None) -> ServedModel:
        r = self._predictor.ModelMetadata(pb2.ModelMetadataRequest(), timeout=self._timeout(timeout))
        features = [
            SparseFeatureInfo(f.name, f.num_embeddings, f.weighted, f.dtype) for f in r.sparse_features
        ]
        return ServedModel(r.model_name, r.model_version, r.dense_in_features, features, r.max_batch_size)

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """The health status name of ``service`` ("" = the whole server): "SERVING", "NOT_SERVING", ..."""
        r = self._health.Check(health_pb2.HealthCheckRequest(service=service), timeout=self._timeout(timeout))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Blocks until the channel connects (raises ``grpc.FutureTimeoutError`` after ``timeout``)."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PredictorClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _timeout(self, timeout: float | None, default: float | None = None) -> float | None:
        if timeout is not None:
            return timeout
        return default if default is not None else self.timeout


def open_channel(
    target: str,
    root_certificates: Path | bytes | None = None,
    client_key: Path | bytes | None = None,
    client_cert: Path | bytes | None = None,
    options: list[tuple[str, int]] | None = None,
) -> grpc.Channel:
    """A plaintext channel, or TLS when ``root_certificates`` is given (mutual with a client key and cert)."""
    if root_certificates is None:
        return grpc.insecure_channel(target, options=options)
    creds = grpc.ssl_channel_credentials(_read(root_certificates), _read(client_key), _read(client_cert))
    return grpc.secure_channel(target, creds, options=options)


def _read(x: Path | bytes | None) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    return Path(x).read_bytes()
