"""Coverage-guided fuzzing (atheris / libFuzzer) of the server's request path, minus the transports.

The server is the one ``recserve serve`` assembles (:class:`RecServer` of a :class:`ServeConfig`, never
started: nothing binds). Each input is one selector byte and a request's bytes, which go where they go in it:
- recserve.v1 ``PredictRequest`` / OIP ``ModelInferRequest`` bytes: our deserialiser (``handlers``), the
  decoder (``codec`` or ``oip``), ``check_request``;
- a REST infer body (JSON, or JSON + binary tensors when the selector's high bit says so): ``rest_codec``,
  then the OIP decoder and ``check_request``;
- Triton's repository load / unload (OIP bytes, or a REST JSON body): the server's repository, which on the
  data port (``--model-control none``, the default) must refuse every one of them, whatever it says.
A request that passes the checks alone is scored as the server scores a batch (the runner's ``scorer``, the
FBGEMM kernels the crash of issue 17 was in, and the refusal of scores that are not finite). Each request is
also queued as the server queues it (parts, or past the wire's rules) and scored with a valid request, its
data checked with the batch: it must get what it got alone (the same scores, to float rounding, or the same
error), and the valid one its own scores. Only the refusals the server maps to a client error
(``InvalidRequestError``; ``PermissionDeniedError`` for control calls) may leave our code; any other
exception, or a crash in a kernel, stops the run and libFuzzer saves the input under --artifacts.

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
    from recserve.server.dataplane.parts import RequestParts
    from recserve.server.dataplane.validation import admit_request, check_request
    from recserve.server.operations.app import RecServer
    from recserve.server.operations.config import ServeConfig
    from recserve.server.transports.codec import decode_predict_request, encode_predict_request
    from recserve.server.transports.handlers import DecodeFailureLog, UndecodableRequest, method_handlers
    from recserve.server.transports.oip import decode_batchable, decode_infer_request
    from recserve.server.transports.protos import oip_pb2, pb2
    from recserve.server.transports.rest_codec import infer_request, split_body
    from recserve.server.transports.servicer import decode_batchable as decode_v1_batchable

from recserve.export import export_package  # noqa: E402
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
        cfg = ServeConfig(package=package, port=0, metrics_port=None, admin_port=None, max_batch_size=64)
        server = RecServer(cfg)  # as `recserve serve` builds it; never started
        self.runner, self.repository = server.core.current, server.repository
        self.schema, self.score = self.runner.schema, self.runner.scorer
        valid = encode_predict_request(*_valid_batch()).SerializeToString()
        self.good = decode_v1_batchable(pb2.PredictRequest.FromString(valid), self.schema)
        (self.good_scores,), _ = self.score([self.good])
        log = DecodeFailureLog(interval_s=3600.0)
        predictor = method_handlers(pb2, "Predictor", _NoServicer(), log)
        oip = method_handlers(oip_pb2, "GRPCInferenceService", _NoServicer(), log)
        self.parse = {PREDICT: predictor["Predict"].request_deserializer}
        self.parse[INFER] = oip["ModelInfer"].request_deserializer
        self.control = [
            (oip["RepositoryModelLoad"].request_deserializer, self.repository.load),
            (oip["RepositoryModelUnload"].request_deserializer, self.repository.unload),
        ]

    def __call__(self, data: bytes) -> None:
        if not data:
            return
        kind, payload = data[0] % KINDS, data[1:]
        if kind in (CONTROL, REST_CONTROL):
            self._control(kind, data[0] // KINDS % 2, payload)
            return
        try:
            request = self._message(kind, data[0] & BINARY, payload)
        except InvalidRequestError:
            return  # refused before it names a model's input (JSON, the binary layout)
        if request is None:
            return  # the server answers INVALID_ARGUMENT (tests/serving/test_input_hardening.py)
        try:
            if kind == PREDICT:
                arrays = decode_predict_request(request)
            else:
                arrays = decode_infer_request(request, self.schema)
            checked = check_request(arrays, self.schema)
        except InvalidRequestError as error:
            self._same_in_a_batch(kind, request, error)
            return
        (scores,), _ = self.score([checked])
        self._same_in_a_batch(kind, request, scores)
        if isinstance(scores, InvalidRequestError):
            return  # not finite: the server refuses the request (recserve_nonfinite_scores_total)
        if scores.shape != (checked.batch_size,) or not bool(torch.isfinite(scores).all()):
            raise AssertionError(f"scores {scores} for a checked batch of {checked.batch_size}")

    def _same_in_a_batch(self, kind: int, request, alone) -> None:
        """The request queued as the server queues it (parts, or past the wire's rules; its data checked
        with its batch), batched with a valid one: it gets what it got checked alone (the same scores, or the
        same error), and the valid request its own scores. Scores may differ by float rounding: a batch of
        another size can take another GEMM kernel; a request's ids read as another's would differ far more."""
        try:
            if kind == PREDICT:
                item = decode_v1_batchable(request, self.schema)
            else:
                item = decode_batchable(request, self.schema, self.runner.oip_layout)
            if not isinstance(item, RequestParts):
                item = admit_request(item, self.schema)
        except InvalidRequestError as error:  # a rule of the wire: refused on arrival, as alone
            if str(error) != str(alone):
                raise AssertionError(f"refused as {error!r} on arrival, as {alone!r} alone") from None
            return
        (good, got), _ = self.score([self.good, item])
        if not _close(good, self.good_scores):
            raise AssertionError("a valid request's scores changed in a batch with this one")
        if isinstance(alone, Exception) or isinstance(got, Exception):
            if type(got) is not type(alone) or str(got) != str(alone):
                raise AssertionError(f"{got!r} in a batch, {alone!r} alone")
        elif not _close(got, alone):
            raise AssertionError(f"scores {got} in a batch, {alone} alone")

    def _message(self, kind: int, binary: int, payload: bytes):
        """The request message of ``payload`` (a REST body as the OIP message it becomes), or None when the
        server could not parse it."""
        if kind == REST_INFER:
            header = None
            if binary:
                header, payload = str(int.from_bytes(payload[:4], "little")), payload[4:]
            doc, tail = split_body(payload, header)
            return infer_request(doc, tail, "fuzz", "")
        request = self.parse[kind](payload)
        return None if isinstance(request, UndecodableRequest) else request

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


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True)


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
