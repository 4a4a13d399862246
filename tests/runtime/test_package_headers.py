"""Issue 43: a package whose safetensors headers lie, or whose manifest is hostile, is refused at load with
one ``PackageError`` naming the file, the tensor or field, and the problem, even when its author recomputed
every sha256 so that the integrity check passes."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from recserve.errors import PackageError
from recserve.export import export_package
from recserve.runtime import Predictor, read_manifest
from recserve.runtime.package import check_safetensors_file
from tests.export.common import dlrm_config, trained_state

CFG = dlrm_config()
ROWS = "t0[0:300].rows"  # 300 kernel rows of 12 bytes (4 of scale/bias, 8 of int8 codes): bytes [0, 3600)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return export_package(
        tmp_path_factory.mktemp("pkg") / "p", model_config=CFG, state_dict=trained_state(CFG), version="7"
    )


@pytest.fixture
def copy(tmp_path, package):
    return shutil.copytree(package, tmp_path / "copy")


def _header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def resign(package: Path, name: str) -> None:
    """Records ``name``'s new size and sha256 in the manifest, as a hostile package's author would."""
    path, manifest = package / name, package / "manifest.json"
    data = json.loads(manifest.read_text())
    data["files"][name] = {
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "bytes": path.stat().st_size,
    }
    manifest.write_text(json.dumps(data))


def rewrite_header(package: Path, name: str, edit, raw: bytes | None = None) -> None:
    path = package / name
    header, rest = _header(path)
    edit(header)
    text = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + rest)
    resign(package, name)


def table_file(package: Path) -> str:
    return next(n for n in json.loads((package / "manifest.json").read_text())["files"] if "embeddings" in n)


def _set(key: str, **fields):
    return lambda header: header[key].update(fields)


TABLE_EDITS = {
    "negative offset": (
        _set(ROWS, data_offsets=[-64, 3536]),
        r"data_offsets \[-64, 3536\]: must be two non-negative integers",
    ),
    "negative shape": (
        _set(ROWS, shape=[-1000, -20]),
        r"shape \[-1000, -20\]: must be a list of non-negative integers",
    ),
    "float offset": (
        _set(ROWS, data_offsets=[0.0, 3600]),
        r"data_offsets \[0.0, 3600\]: must be two non-neg",
    ),
    "bool dim": (_set(ROWS, shape=[True, 3600]), r"shape \[true, 3600\]: must be a list of non-negative"),
    "three offsets": (_set(ROWS, data_offsets=[0, 1, 3600]), r"data_offsets \[0, 1, 3600\]: must be two"),
    "begin after end": (
        _set(ROWS, data_offsets=[3600, 0]),
        r"data_offsets \[3600, 0\]: begins after it ends",
    ),
    "past the data": (
        _set(ROWS, data_offsets=[2**62, 2**62 + 3600]),
        r"data_offsets \[4611686018427387904, 4611686018427391504\]: ends past the data section",
    ),
    "size of the shape": (
        _set(ROWS, shape=[299, 12]),
        r"data_offsets \[0, 3600\]: 3600 bytes, but shape \[299, 12\] of U8 is 3588 bytes",
    ),
    "unknown dtype": (_set(ROWS, dtype="X9"), r"dtype 'X9' is not one of BOOL, U8"),
    "entry not an object": (lambda h: h.update({ROWS: [0, 3600]}), r"needs 'dtype', 'shape' and 'data_off"),
}


@pytest.mark.parametrize("edit", list(TABLE_EDITS))
def test_a_table_file_header_that_lies_is_named(copy, edit):
    change, message = TABLE_EDITS[edit]
    name = table_file(copy)
    rewrite_header(copy, name, change)
    with pytest.raises(PackageError, match=re.escape(f"{name}: tensor {ROWS!r}: ") + message):
        Predictor.load(copy)


def _by_offset(header: dict) -> list[tuple[str, dict]]:
    return sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"]
    )


def test_a_tensor_over_another_ones_bytes_is_named(copy):
    name = table_file(copy)
    key, entry = _by_offset(_header(copy / name)[0])[-1]
    begin, end = entry["data_offsets"]
    rewrite_header(copy, name, _set(key, data_offsets=[0, end - begin]))  # the first tensor's bytes
    with pytest.raises(
        PackageError, match=r"tensor '.*': data_offsets \[0, \d+\]: overlaps tensor '.*', which"
    ):
        Predictor.load(copy)


def test_bytes_between_tensors_are_named(copy):
    name = table_file(copy)
    path = copy / name
    key, entry = _by_offset(_header(path)[0])[-1]
    begin, end = entry["data_offsets"]
    path.write_bytes(path.read_bytes() + b"\0" * 16)
    rewrite_header(copy, name, _set(key, data_offsets=[begin + 16, end + 16]))
    with pytest.raises(
        PackageError,
        match=rf"tensor '.*': data_offsets .*: leaves bytes \[{begin}, {begin + 16}\) of the data",
    ):
        Predictor.load(copy)


def test_unused_bytes_in_the_data_section_are_refused(copy):
    name = table_file(copy)
    path = copy / name
    path.write_bytes(path.read_bytes() + b"\0" * 16)  # bytes no tensor describes (safetensors refuses them)
    resign(copy, name)
    with pytest.raises(
        PackageError, match=rf"{name}: the tensors end at byte \d+ of the data section, which"
    ):
        Predictor.load(copy)


def test_what_only_safetensors_checks_is_refused_by_it(copy):
    name = table_file(copy)
    rewrite_header(copy, name, lambda h: h.update(__metadata__={"format": 1}))  # metadata values are strings
    with pytest.raises(PackageError, match=rf"{name}: refused by safetensors \('Error while deserializing"):
        Predictor.load(copy)


def test_a_repeated_key_is_refused_rather_than_resolved(copy):
    name = table_file(copy)
    header, _ = _header(copy / name)
    text = json.dumps(header)
    entry = json.dumps({ROWS: header[ROWS]})[1:-1]
    raw = (text[:-1] + ", " + entry + "}").encode()  # the same tensor named twice: JSON keeps the last one
    rewrite_header(copy, name, lambda h: None, raw=raw)
    with pytest.raises(PackageError, match=re.escape(f"{name}: header: key {ROWS!r} appears twice")):
        Predictor.load(copy)


def test_a_deeply_nested_header_is_one_error(copy):
    rewrite_header(copy, "dense.safetensors", lambda h: None, raw=b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(
        PackageError,
        match=r"dense\.safetensors: cannot be read as safetensors: its header is nested too deeply",
    ):
        Predictor.load(copy)


def test_the_dense_file_is_checked_too(copy):
    header, _ = _header(copy / "dense.safetensors")
    key = next(k for k in header if k != "__metadata__")
    rewrite_header(copy, "dense.safetensors", _set(key, shape=[-1000, -20]))
    with pytest.raises(PackageError, match=r"dense\.safetensors: tensor .*: shape \[-1000, -20\]: must be"):
        Predictor.load(copy)


def test_a_message_never_carries_a_control_character(copy):
    name = table_file(copy)
    rewrite_header(copy, name, lambda h: h.update({"x\n\x1b[2J": h.pop(ROWS)}))
    rewrite_header(copy, name, _set("x\n\x1b[2J", shape=[-1]))
    with pytest.raises(PackageError) as caught:
        Predictor.load(copy)
    assert "tensor 'x\\n\\x1b[2J'" in str(caught.value) and str(caught.value).isprintable()


def test_the_checked_header_gives_every_tensor_of_a_real_file(package):
    name = table_file(package)
    header, _ = _header(package / name)
    stored = check_safetensors_file(package / name)
    assert set(stored) == set(header) - {"__metadata__"}
    data_start = (package / name).stat().st_size - sum(s.nbytes for s in stored.values())
    for key, spec in stored.items():
        assert spec.start == data_start + header[key]["data_offsets"][0]
        assert list(spec.shape) == header[key]["shape"] and spec.dtype == header[key]["dtype"]


def _set_manifest(package: Path, text: str) -> None:
    (package / "manifest.json").write_text(text)


@pytest.mark.parametrize(
    "version", ["1\n", "v1", "1.0", "-1", "", " 1", "²", "٣", "1" * 20, 1.5, True, None, [1]]
)
def test_a_manifest_version_must_be_digits(copy, version):
    data = json.loads((copy / "manifest.json").read_text())
    _set_manifest(copy, json.dumps({**data, "version": version}))
    with pytest.raises(PackageError) as caught:
        read_manifest(copy)
    message = str(caught.value)
    assert message.startswith(f"{copy / 'manifest.json'}: version ") and message.isprintable(), message
    assert "must be digits only" in message or "exceeds" in message


@pytest.mark.parametrize(("version", "read"), [("7", "7"), ("0042", "0042"), (3, "3"), (str(2**63 - 1),) * 2])
def test_digit_versions_are_read(copy, version, read):
    data = json.loads((copy / "manifest.json").read_text())
    _set_manifest(copy, json.dumps({**data, "version": version}))
    assert read_manifest(copy).version == read


def test_a_deeply_nested_manifest_is_one_error(copy):
    text = (copy / "manifest.json").read_text().rstrip()
    _set_manifest(copy, text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(
        PackageError, match=r"manifest\.json: nested too deeply to be a model package manifest"
    ):
        read_manifest(copy)
