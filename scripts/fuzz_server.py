"""Coverage-guided fuzzing (atheris / libFuzzer) of the server's request path, minus the transports.

Each input is one selector byte and a request's bytes, which go where they go in the server:
- recserve.v1 ``PredictRequest`` / OIP ``ModelInferRequest`` bytes: our deserialiser (``handlers``), the
  decoder (``codec`` or ``oip``), ``check_request``;
- a REST infer body (JSON, or JSON + binary tensors when the selector's high bit says so): ``rest_codec``,
  then the OIP decoder and ``check_request``;
- Triton's repository load / unload (OIP bytes, or a REST JSON body): the control plane, which on the data
  port (``--model-control none``, the default) must refuse every one of them, whatever it says.
A request that passes the checks is scored as the server scores a batch (``ModelRunner``, the FBGEMM kernels
the crash of issue 17 was in, and the refusal of scores that are not finite). A gRPC request the server
queues as parts (checked over its merged batch, issue 37) is also scored merged with a valid request: it must
get what it got alone (the same scores or the same error), and the valid one its own scores. Only the
refusals the server maps to a client error (``InvalidRequestError``; ``PermissionDeniedError`` for control
calls) may leave our code; any other exception, or a crash in a kernel, stops the run and libFuzzer saves
the input under --artifacts.

    python scripts/fuzz_server.py --seconds 600          # a longer run (CI runs 20 s: tests/serving)
    python scripts/fuzz_server.py --artifacts DIR crash-<sha>   # replay a saved input
"""

from __future__ import annotations

import argparse
import json
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
    from recserve.errors import InvalidRequestError, PermissionDeniedError
    from recserve.server.batcher import BatcherConfig
    from recserve.server.codec import decode_predict_request, encode_predict_request
    from recserve.server.core import InferenceCore
    from recserve.server.handlers import DecodeFailureLog, UndecodableRequest, method_handlers
    from recserve.server.metrics import ServerMetrics
    from recserve.server.oip import decode_batchable, decode_infer_request
    from recserve.server.parts import RequestParts
    from recserve.server.protos import oip_pb2, pb2
    from recserve.server.reload import Reloader
    from recserve.server.rest_codec import infer_request, split_body
    from recserve.server.runner import ModelRunner
    from recserve.server.servicer import decode_batchable as decode_v1_batchable
    from recserve.server.triton_ext import Repository
    from recserve.server.validation import check_request

from recserve.export import export_package  # noqa: E402
from recserve.runtime import Predictor  # noqa: E402
from rectrain import EmbeddingBagConfig  # noqa: E402
from rectrain.models import build_model  # noqa: E402
from rectrain.models.config import ModelConfig  # noqa: E402
from rectrain.sparse import KeyedJaggedTensor  # noqa: E402

FEATURES = ["f0", "f1", "f2", "f3"]
ROWS = [10, 20, 30, 40]
DENSE = 3
PREDICT, INFER, REST_INFER, CONTROL, REST_CONTROL = range(5)
KINDS = 5
BINARY = 0x80  # with REST_INFER: the body carries binary tensors after its JSON


def build_package(out: Path) -> Path:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=8, feature_names=[f])
        for i, (f, n) in enumerate(zip(FEATURES, ROWS))
    ]
    cfg = ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=DENSE, dense_arch_layer_sizes=[8, 8],
        over_arch_layer_sizes=[8, 1],
    )  # fmt: skip
    torch.manual_seed(0)
    return export_package(out, model_config=cfg, state_dict=build_model(cfg).state_dict(), model_name="fuzz")


def _valid_batch(b: int = 2) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    lengths = torch.arange(len(FEATURES) * b) % 3
    per_key = lengths.view(len(FEATURES), b).sum(1).tolist()
    values = torch.cat([torch.arange(n) % rows for n, rows in zip(per_key, ROWS)])
    kjt = KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths)
    return torch.randn(b, DENSE, generator=torch.Generator().manual_seed(b)), kjt


def seed_corpus(corpus: Path) -> None:
    """Valid requests of both kinds, raw and typed, so mutations start from messages that parse."""
    corpus.mkdir(parents=True, exist_ok=True)
    for b in (1, 3):
        dense, kjt = _valid_batch(b)
        for raw in (True, False):
            msg = encode_predict_request(dense, kjt, raw=raw).SerializeToString()
            (corpus / f"predict-b{b}-{raw}").write_bytes(bytes([PREDICT]) + msg)
            msg = _infer_request(dense, kjt, raw).SerializeToString()
            (corpus / f"infer-b{b}-{raw}").write_bytes(bytes([INFER]) + msg)
        (corpus / f"rest-b{b}").write_bytes(bytes([REST_INFER]) + _rest_body(dense, kjt, binary=False))
        (corpus / f"rest-bin-b{b}").write_bytes(bytes([REST_INFER | BINARY]) + _rest_body(dense, kjt, True))
    for index, msg in enumerate(
        (oip_pb2.RepositoryModelLoadRequest(model_name="fuzz"), oip_pb2.RepositoryModelUnloadRequest())
    ):
        (corpus / f"control-{index}").write_bytes(bytes([CONTROL + KINDS * index]) + msg.SerializeToString())
    body = json.dumps({"parameters": {"unload_dependents": True}}).encode()
    (corpus / "rest-control").write_bytes(bytes([REST_CONTROL]) + body)


def _rest_body(dense: torch.Tensor, kjt: KeyedJaggedTensor, binary: bool) -> bytes:
    """A REST infer body; with ``binary`` its first 4 bytes are the JSON length, the tensors follow it."""
    arrays = [("dense", "FP32", list(dense.shape), dense.numpy().astype("<f4"))]
    for k in FEATURES:
        jt = kjt[k]
        arrays.append((f"{k}.lengths", "INT64", [jt.lengths().numel()], jt.lengths().numpy().astype("<i8")))
        arrays.append((f"{k}.values", "INT64", [jt.values().numel()], jt.values().numpy().astype("<i8")))
    if not binary:
        inputs = [{"name": n, "datatype": d, "shape": s, "data": a.tolist()} for n, d, s, a in arrays]
        return json.dumps({"id": "f", "inputs": inputs}).encode()
    inputs = [
        {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": a.nbytes}}
        for n, d, s, a in arrays
    ]
    head = json.dumps({"inputs": inputs}).encode()
    return len(head).to_bytes(4, "little") + head + b"".join(a.tobytes() for *_, a in arrays)


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
    kind = data[0] % KINDS if data else PREDICT
    if kind not in (PREDICT, INFER):
        return None  # JSON bodies and control calls: libFuzzer's byte mutations
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

    def __init__(self, package: Path) -> None:
        self.runner = ModelRunner(
            Predictor.load(package), BatcherConfig(max_batch_size=64), package_dir=package
        )
        self.schema = self.runner.schema
        valid = encode_predict_request(*_valid_batch()).SerializeToString()
        self.good = decode_v1_batchable(pb2.PredictRequest.FromString(valid), self.schema)
        (self.good_scores,) = self.runner._predict_batch([self.good], record=False)
        core = InferenceCore(self.runner)
        reloader = Reloader(core, lambda _: self.runner, ServerMetrics())
        # The data port's repository as `recserve serve` builds it by default (--model-control none).
        self.repository = Repository(core, reloader, package.parent, polling=False)
        log = DecodeFailureLog(interval_s=3600.0)
        self.parse = {
            PREDICT: method_handlers(pb2, "Predictor", _NoServicer(), log)["Predict"].request_deserializer,
            INFER: method_handlers(oip_pb2, "GRPCInferenceService", _NoServicer(), log)[
                "ModelInfer"
            ].request_deserializer,
        }
        control = method_handlers(oip_pb2, "GRPCInferenceService", _NoServicer(), log)
        self.control = [
            (control["RepositoryModelLoad"].request_deserializer, self.repository.load),
            (control["RepositoryModelUnload"].request_deserializer, self.repository.unload),
        ]

    def __call__(self, data: bytes) -> None:
        if not data:
            return
        kind, payload = data[0] % KINDS, data[1:]
        if kind in (CONTROL, REST_CONTROL):
            self._control(kind, data[0] // KINDS % 2, payload)
            return
        try:
            arrays = self._decode(kind, data[0] & BINARY, payload)
            if arrays is None:
                return
            checked = check_request(arrays, self.schema)
        except InvalidRequestError as error:
            self._same_in_a_batch(kind, payload, error)
            return
        (scores,) = self.runner._predict_batch([checked], record=False)
        self._same_in_a_batch(kind, payload, scores)
        if isinstance(scores, InvalidRequestError):
            return  # not finite: the server refuses the request (recserve_nonfinite_scores_total)
        if scores.shape != (checked.batch_size,) or not bool(torch.isfinite(scores).all()):
            raise AssertionError(f"scores {scores} for a checked batch of {checked.batch_size}")

    def _same_in_a_batch(self, kind: int, payload: bytes, alone) -> None:
        """A gRPC request the server queues as parts (checked over its batch, issue 37), merged with a valid
        one: it gets what the exact path gave it alone (the same scores, or the same error), and the valid
        request its own scores."""
        if kind not in (PREDICT, INFER):
            return
        request = self.parse[kind](payload)
        if isinstance(request, UndecodableRequest):
            return
        try:
            if kind == PREDICT:
                parts = decode_v1_batchable(request, self.schema)
            else:
                parts = decode_batchable(request, self.schema, self.runner.oip_layout)
        except InvalidRequestError as error:  # request parameters or outputs: the exact path's refusal
            if str(error) != str(alone):
                raise AssertionError(f"refused as {error!r} in a batch, as {alone!r} alone") from None
            return
        if not isinstance(parts, RequestParts):
            return  # the server checks it on arrival, by the exact path
        good, got = self.runner._predict_batch([self.good, parts], record=False)
        if not torch.equal(good, self.good_scores):
            raise AssertionError("a valid request's scores changed in a batch with this one")
        if isinstance(alone, Exception) or isinstance(got, Exception):
            if type(got) is not type(alone) or str(got) != str(alone):
                raise AssertionError(f"{got!r} in a batch, {alone!r} alone")
        elif not torch.equal(got, alone):
            raise AssertionError(f"scores {got} in a batch, {alone} alone")

    def _decode(self, kind: int, binary: int, payload: bytes):
        if kind == REST_INFER:
            header = None
            if binary:
                header, payload = str(int.from_bytes(payload[:4], "little")), payload[4:]
            doc, tail = split_body(payload, header)
            return decode_infer_request(infer_request(doc, tail, "fuzz", ""), self.schema)
        request = self.parse[kind](payload)
        if isinstance(request, UndecodableRequest):
            return None  # the server answers INVALID_ARGUMENT (tests/serving/test_input_hardening.py)
        return (
            decode_predict_request(request) if kind == PREDICT else decode_infer_request(request, self.schema)
        )

    def _control(self, kind: int, which: int, payload: bytes) -> None:
        """A load or unload on the data port: refused, whatever it asks; only a malformed REST body may be
        refused first (400), as the REST handler parses it before the call."""
        parse, call = self.control[which]
        if kind == REST_CONTROL:
            try:
                doc = json.loads(payload)
            except (ValueError, UnicodeDecodeError, RecursionError):
                return
            parameters = doc.get("parameters", {}) if isinstance(doc, dict) else None
            name, authorization = "fuzz", None
        else:
            request = parse(payload)
            if isinstance(request, UndecodableRequest):
                return
            parameters, name, authorization = request.parameters, request.model_name, "Bearer x"
        try:
            call(name, parameters, authorization)
        except PermissionDeniedError:
            return
        raise AssertionError("a repository call on the data port was not refused")


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
    target = Target(build_package(work / "models" / "1"))
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
