"""Wire arrays <-> tensors: one typed-or-raw decoder per dtype, shared by both gRPC APIs and the client.

Raw fields are little-endian on the wire whatever the host's byte order (``"<i8"`` etc.); decoding a raw field
is one ``np.frombuffer`` plus one copy into memory torch may write to. Errors name the wire field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from recserve.runtime.validation import RequestFields

# How errors name the fields of a request: recserve.v1's, and the Open Inference Protocol's (by input).
V1_FIELDS = RequestFields(
    keys="sparse.keys", lengths="sparse.lengths", values="sparse.values", weights="sparse.weights"
)
OIP_FIELDS = RequestFields(
    dense="inputs['dense']",
    keys="inputs",
    lengths="inputs['{f}.lengths']",
    values="inputs['{f}.values']",
    weights="inputs['{f}.weights']",
)
# wire dtype -> (little-endian numpy dtype, torch dtype)
WIRE_DTYPES = {
    "int32": ("<i4", torch.int32),
    "int64": ("<i8", torch.int64),
    "float32": ("<f4", torch.float32),
}


def decode_array(field: str, typed, raw: bytes, dtype: str) -> Tensor:
    """A 1-D tensor from a typed repeated field or its raw bytes twin (at most one may be set)."""
    le, torch_dtype = WIRE_DTYPES[dtype]
    if raw:
        if len(typed):
            raise InvalidRequestError(f"{field}: set the typed field or {field}_raw, not both")
        itemsize = np.dtype(le).itemsize
        if len(raw) % itemsize:
            raise InvalidRequestError(
                f"{field}_raw: {len(raw)} bytes is not a multiple of {itemsize} ({dtype} little-endian)"
            )
        return torch.from_numpy(np.frombuffer(raw, dtype=le).astype(le[1:]))
    return torch.from_numpy(np.asarray(typed, dtype=le[1:])).to(torch_dtype)


def encode_raw(t: Tensor, dtype: str) -> bytes:
    """Little-endian bytes of ``t`` (flattened row-major) as the wire ``dtype``."""
    le, torch_dtype = WIRE_DTYPES[dtype]
    if t.dtype == torch_dtype and t.device.type == "cpu" and not t.requires_grad:
        # A reply's scores (a view of the batch's): numpy reads the view as it is and ``tobytes`` copies it
        # once, without the four torch calls (each a dispatch and a GIL release) of the general path.
        return t.numpy().astype(le, copy=False).tobytes()
    return t.detach().to("cpu", torch_dtype).contiguous().numpy().astype(le, copy=False).tobytes()


def from_raw(raw: bytes, dtype: str) -> Tensor:
    """Inverse of :func:`encode_raw` for trusted data (replies); no size checks beyond numpy's."""
    le, _ = WIRE_DTYPES[dtype]
    return torch.from_numpy(np.frombuffer(raw, dtype=le).astype(le[1:]))


@dataclass
class FeatureArrays:
    """One request as decoded from the wire, before it is checked against the model.

    ``lengths`` are key-major (``len(keys) * batch_size`` entries, TorchRec's KJT layout); ``dense`` is flat,
    row-major ``batch_size * width`` floats.
    """

    batch_size: int
    dense: Tensor
    keys: list[str]
    lengths: Tensor
    values: Tensor
    weights: Tensor | None = None
    request_id: str = ""
    counts: list[int] | None = None  # ids sent per key, where the wire sends each key's apart (OIP)
    fields: RequestFields = V1_FIELDS  # how errors name the request's fields
