"""Coverage-guided fuzzing (atheris / libFuzzer) of the server's request path, minus gRPC and batching.

Each input is one selector byte (recserve.v1 PredictRequest or OIP ModelInferRequest) and the message bytes.
They go where a request's bytes go in the server: our deserialiser (``handlers``), the decoder (``codec``
or ``oip``), ``check_request``, and then, when the checks pass, ``Predictor.predict(checked=True)`` on a small
real int8 package (the FBGEMM kernels the crash of issue 17 was in). Only ``InvalidRequestError`` may leave
our code; any other exception, or a crash in a kernel, stops the run and libFuzzer saves the input under
--artifacts.

    python scripts/fuzz_server.py --seconds 600          # a longer run (CI runs 20 s: tests/serving)
    python scripts/fuzz_server.py --artifacts DIR crash-<sha>   # replay a saved input
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import atheris

# Heavy dependencies first, uninstrumented: only our request path is worth the coverage feedback.
import grpc  # noqa: F401
import numpy as np
import torch
from google.protobuf.descriptor import FieldDescriptor

with atheris.instrument_imports(include=["recserve.server"]):
    from recserve.errors import InvalidRequestError
    from recserve.server.codec import decode_predict_request, encode_predict_request
    from recserve.server.handlers import DecodeFailureLog, UndecodableRequest, method_handlers
    from recserve.server.oip import decode_infer_request
    from recserve.server.protos import oip_pb2, pb2
    from recserve.server.validation import ModelSchema, check_request

from recserve.export import export_package  # noqa: E402
from recserve.runtime import Predictor  # noqa: E402
from rectrain import EmbeddingBagConfig  # noqa: E402
from rectrain.models import build_model  # noqa: E402
from rectrain.models.config import ModelConfig  # noqa: E402
from rectrain.sparse import KeyedJaggedTensor  # noqa: E402

FEATURES = ["f0", "f1", "f2", "f3"]
ROWS = [10, 20, 30, 40]
DENSE = 3
PREDICT, INFER = 0, 1


def build_predictor(out: Path) -> Predictor:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=8, feature_names=[f])
        for i, (f, n) in enumerate(zip(FEATURES, ROWS))
    ]
    cfg = ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=DENSE, dense_arch_layer_sizes=[8, 8],
        over_arch_layer_sizes=[8, 1],
    )  # fmt: skip
    torch.manual_seed(0)
    export_package(out, model_config=cfg, state_dict=build_model(cfg).state_dict(), model_name="fuzz")
    return Predictor.load(out)


def seed_corpus(corpus: Path) -> None:
    """Valid requests of both kinds, raw and typed, so mutations start from messages that parse."""
    corpus.mkdir(parents=True, exist_ok=True)
    for b in (1, 3):
        lengths = torch.arange(len(FEATURES) * b) % 3
        per_key = lengths.view(len(FEATURES), b).sum(1).tolist()
        values = torch.cat([torch.arange(n) % rows for n, rows in zip(per_key, ROWS)])
        kjt = KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths)
        dense = torch.randn(b, DENSE)
        for raw in (True, False):
            msg = encode_predict_request(dense, kjt, raw=raw).SerializeToString()
            (corpus / f"predict-b{b}-{raw}").write_bytes(bytes([PREDICT]) + msg)
            msg = _infer_request(dense, kjt, raw).SerializeToString()
            (corpus / f"infer-b{b}-{raw}").write_bytes(bytes([INFER]) + msg)


def _infer_request(dense: torch.Tensor, kjt: KeyedJaggedTensor, raw: bool) -> oip_pb2.ModelInferRequest:
    req = oip_pb2.ModelInferRequest(model_name="fuzz")
    arrays = [("dense", "FP32", list(dense.shape), dense.numpy().astype("<f4"), "fp32_contents")]
    for k in FEATURES:
        jt = kjt[k]
        lengths, values = jt.lengths().numpy().astype("<i8"), jt.values().numpy().astype("<i8")
        arrays.append((f"{k}.lengths", "INT64", [lengths.size], lengths, "int64_contents"))
        arrays.append((f"{k}.values", "INT64", [values.size], values, "int64_contents"))
    for name, dtype, shape, arr, field in arrays:
        t = req.inputs.add(name=name, datatype=dtype, shape=shape)
        if raw:
            req.raw_input_contents.append(arr.tobytes())
        else:
            getattr(t.contents, field).extend(arr.reshape(-1).tolist())
    return req


# Values that break counts: the wrap of issue 17 (2^62 four times), the int32/int64 edges, small negatives.
INTERESTING = [2**62, 2**62 + 3, 2**63 - 1, -(2**63), 2**31 - 1, -(2**31), 2**32, 2**30, -1, 0, 1, 3]
_INT_TYPES = {
    FieldDescriptor.TYPE_INT32: 32,
    FieldDescriptor.TYPE_INT64: 64,
    FieldDescriptor.TYPE_UINT32: 32,
    FieldDescriptor.TYPE_UINT64: 64,
}


def _slots(msg, out: list) -> list:
    """Every integer and bytes value of ``msg`` (recursively) as ``(message, field, index or None)``."""
    for fd, value in msg.ListFields():
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                continue
            for sub in value if _repeated(fd) else [value]:
                _slots(sub, out)
        elif fd.type in _INT_TYPES or fd.type == FieldDescriptor.TYPE_BYTES:
            out += [(msg, fd, i) for i in range(len(value))] if _repeated(fd) else [(msg, fd, None)]
    return out


def _repeated(fd) -> bool:
    # protobuf >= 5.28 has is_repeated (and 7 dropped label)
    return fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == FieldDescriptor.LABEL_REPEATED


def _wrap(value: int, bits: int, signed: bool) -> int:
    value %= 2**bits
    return value - 2**bits if signed and value >= 2 ** (bits - 1) else value


def mutate_structure(data: bytes, rng: random.Random) -> bytes | None:
    """Parses ``data`` and sets one integer (a field, or one little-endian word of a raw bytes field) to an
    interesting value: byte-level mutation alone rarely keeps a message parseable and its sizes consistent."""
    kind = data[0] % 2 if data else PREDICT
    cls = pb2.PredictRequest if kind == PREDICT else oip_pb2.ModelInferRequest
    try:
        msg = cls.FromString(data[1:])
    except Exception:
        return None
    slots = _slots(msg, [])
    if not slots:
        return None
    parent, fd, index = rng.choice(slots)
    new = rng.choice(INTERESTING)
    if fd.type == FieldDescriptor.TYPE_BYTES:
        raw = bytearray(getattr(parent, fd.name)[index] if index is not None else getattr(parent, fd.name))
        width = rng.choice([4, 8])
        if len(raw) < width:
            return None
        at = rng.randrange(0, len(raw) - width + 1, width)
        raw[at : at + width] = _wrap(new, 8 * width, False).to_bytes(width, "little")
        if index is not None:
            getattr(parent, fd.name)[index] = bytes(raw)
        else:
            setattr(parent, fd.name, bytes(raw))
    else:
        bits, signed = (
            _INT_TYPES[fd.type],
            fd.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64),
        )
        new = _wrap(new, bits, signed)
        if index is not None:
            getattr(parent, fd.name)[index] = new
        else:
            setattr(parent, fd.name, new)
    return bytes([kind]) + msg.SerializeToString()


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if rng.random() < 0.5:
        out = mutate_structure(data, rng)
        if out is not None and len(out) <= max_size:
            return out
    return atheris.Mutate(data, max_size)


class _NoServicer:
    """method_handlers needs a servicer only to look its methods up; the fuzz target calls none."""

    def __getattr__(self, name):
        return None


class Target:
    """One fuzz input through the server's request path."""

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor
        self.schema = ModelSchema.from_metadata(predictor.metadata, max_batch_size=64)
        log = DecodeFailureLog(interval_s=3600.0)
        self.parse = [
            method_handlers(pb2, "Predictor", _NoServicer(), log)["Predict"].request_deserializer,
            method_handlers(oip_pb2, "GRPCInferenceService", _NoServicer(), log)[
                "ModelInfer"
            ].request_deserializer,
        ]

    def __call__(self, data: bytes) -> None:
        if not data:
            return
        kind = data[0] % 2
        request = self.parse[kind](data[1:])
        if isinstance(request, UndecodableRequest):
            return  # the server answers INVALID_ARGUMENT (tests/serving/test_input_hardening.py)
        try:
            arrays = (
                decode_predict_request(request)
                if kind == PREDICT
                else decode_infer_request(request, self.schema)
            )
            checked = check_request(arrays, self.schema)
        except InvalidRequestError:
            return
        scores = self.predictor.predict(checked.dense, checked.kjt, checked=True)
        if scores.shape != (checked.batch_size,) or not bool(torch.isfinite(scores).all()):
            raise AssertionError(f"scores {scores} for a checked batch of {checked.batch_size}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time (libFuzzer -max_total_time)")
    parser.add_argument(
        "--corpus", type=Path, default=None, help="corpus directory (kept; default: temporary)"
    )
    parser.add_argument("--artifacts", type=Path, default=None, help="where crashing inputs are saved")
    args, rest = parser.parse_known_args(argv[1:])
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="recserve-fuzz-"))
    corpus = args.corpus or work / "corpus"
    seed_corpus(corpus)
    artifacts = args.artifacts or work / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    target = Target(build_predictor(work / "package"))
    np.seterr(all="ignore")
    libfuzzer = [
        f"-max_total_time={args.seconds}",
        f"-artifact_prefix={artifacts}/",
        "-timeout=20",
        "-rss_limit_mb=4096",
        "-print_final_stats=1",
    ]
    files = [a for a in rest if not a.startswith("-")]
    atheris.Setup(
        [argv[0], *libfuzzer, *rest, *([] if files else [str(corpus)])], target, custom_mutator=custom_mutator
    )
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
