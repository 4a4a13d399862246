"""The Triton Python-backend model that serves a recserve package (``model.py`` imports it from here).

Triton's dynamic batcher hands ``execute`` a list of requests; each is one request of the package's wire form
with a leading dimension of 1 (``dense`` ``[1, B, W]``, ``<f>.lengths`` ``[1, B]``, ``<f>.values`` ``[1, N]``:
the repository batches requests, and ragged batching lets their B and N differ). They are scored by the batch
function ``recserve serve`` runs (:class:`recserve.server.dataplane.scoring.BatchScorer`): merged, checked
over the merged batch, one ``Predictor.predict``, split; a request at fault gets its own error naming the
field, the others their scores. The backend's interpreter must import recserve and torch (``PYTHONPATH``).

Model parameters (``config.pbtxt``): ``torch_threads`` (intra-op threads of this instance) and
``max_examples_per_request``.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recserve.errors import InvalidRequestError
from recserve.server.dataplane.arrays import OIP_FIELDS, FeatureArrays
from recserve.server.dataplane.parts import RequestParts
from recserve.server.dataplane.scoring import BatchItem, BatchScorer
from recserve.server.dataplane.validation import ModelSchema, admit_request, check_request

logger = logging.getLogger(__name__)

PACKAGE_DIR = "package"  # inside the version directory
_I32, _I64 = np.dtype("<i4"), np.dtype("<i8")


def _parameters(model_config: dict[str, Any]) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}


class TritonPythonModel:
    """Triton's Python-backend interface: ``initialize``, ``execute``, ``finalize``."""

    def initialize(self, args: dict[str, str]) -> None:
        from recserve.runtime import Predictor

        params = _parameters(json.loads(args["model_config"]))
        torch.set_num_threads(int(params.get("torch_threads", "1")))
        package = Path(args["model_repository"]) / args["model_version"] / PACKAGE_DIR
        self.predictor = Predictor.load(package)
        max_examples = int(params.get("max_examples_per_request", "512"))
        self.schema = ModelSchema.from_metadata(self.predictor.metadata, max_examples)
        self.scorer = BatchScorer(self.predictor, self.schema)

    def execute(self, requests: list) -> list:
        import triton_python_backend_utils as pb_utils

        items: list[BatchItem | Exception] = []
        alive: list = []  # an input's array is a view of its tensor's memory: hold the tensors until done
        for request in requests:
            try:
                get = functools.partial(_input, pb_utils, request, alive)
                items.append(self.item(get, request.request_id()))
            except InvalidRequestError as error:
                items.append(error)
        valid = [i for i in items if not isinstance(i, Exception)]
        scored = iter(self.scorer(valid)[0] if valid else ())
        responses = []
        for item in items:
            result = item if isinstance(item, Exception) else next(scored)
            if isinstance(result, Exception):
                responses.append(pb_utils.InferenceResponse(error=_error(pb_utils, result)))
            else:
                scores = pb_utils.Tensor("scores", result.numpy().reshape(1, -1))
                responses.append(pb_utils.InferenceResponse(output_tensors=[scores]))
        return responses

    def item(self, get, request_id: str = "") -> BatchItem:
        """One request as the batch takes it; ``get(name)`` is the named input as an array (or None)."""
        s = self.schema
        dense = _one_request("dense", get("dense"), 3)
        b = dense.shape[0]
        if not 0 < b <= s.max_batch_size:
            raise InvalidRequestError(
                f"inputs['dense'].shape: {b} examples; send 1 to {s.max_batch_size} per request"
            )
        lengths = [_one_request(f"{f}.lengths", get(f"{f}.lengths"), 2) for f in s.feature_names]
        values = [_one_request(f"{f}.values", get(f"{f}.values"), 2) for f in s.feature_names]
        for f, x in zip(s.feature_names, lengths):
            if x.shape[0] != b:
                name = f"{f}.lengths"
                raise InvalidRequestError(f"inputs[{name!r}]: {x.shape[0]} entries for {b} examples")
        weights = [get(f"{f}.weights") for f in s.feature_names] if s.weighted_features else []

        def arrays() -> FeatureArrays:  # the exact path's form, built only when it is needed
            return FeatureArrays(
                batch_size=b,
                dense=torch.from_numpy(dense.reshape(-1).copy()),
                keys=list(s.feature_names),
                lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int64)),
                values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
                request_id=request_id,
                counts=[int(x.size) for x in values],
                fields=OIP_FIELDS,
            )

        if any(w is not None for w in weights):
            return _weighted(arrays(), weights, s)
        return RequestParts(
            b,
            np.ascontiguousarray(dense, dtype="<f4"),
            [np.ascontiguousarray(x, dtype=_I32) for x in lengths],
            _I32,
            [np.ascontiguousarray(x, dtype=_I64) for x in values],
            [int(x.size) for x in values],
            None,
            _I64,
            s,
            lambda schema: check_request(arrays(), schema),
            request_id,
        )

    def finalize(self) -> None:
        logger.info("recserve Triton backend: %s %s unloaded", self.schema.model_name, self.schema.version)


def _error(pb_utils: Any, error: Exception) -> Any:
    """The Triton error of a refused request: INVALID_ARG for bad input (as ``recserve serve`` answers)."""
    if isinstance(error, InvalidRequestError) and hasattr(pb_utils.TritonError, "INVALID_ARG"):
        return pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG)
    return pb_utils.TritonError(str(error))


def _input(pb_utils: Any, request: Any, alive: list, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    alive.append(tensor)
    return tensor.as_numpy()


def _one_request(name: str, array: np.ndarray | None, rank: int) -> np.ndarray:
    """The input of one request without its leading 1 (Triton batches requests here, not examples)."""
    if array is None:
        raise InvalidRequestError(f"inputs[{name!r}]: missing")
    if array.ndim != rank or array.shape[0] != 1:
        raise InvalidRequestError(
            f"inputs[{name!r}].shape: expected a leading dimension of 1 (one request) and rank {rank}, "
            f"got {list(array.shape)}"
        )
    return array[0]


def _weighted(arrays: FeatureArrays, weights: list, schema: ModelSchema) -> BatchItem:
    missing = [f for f, w in zip(schema.feature_names, weights) if w is None]
    if missing:
        name = f"{missing[0]}.weights"
        raise InvalidRequestError(f"inputs[{name!r}]: give weights for every feature or for none")
    rows = [_one_request(f"{f}.weights", w, 2) for f, w in zip(schema.feature_names, weights)]
    arrays.weights = torch.from_numpy(np.concatenate(rows).astype(np.float32))
    return admit_request(arrays, schema)  # its data is checked with its batch, as in `recserve serve`
