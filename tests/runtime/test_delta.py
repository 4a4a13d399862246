"""``read_delta`` verifies everything (identity, order, checksums, file set, widths, ids) and names the file
and field it refuses; ``list_stream`` finds the newest base and its deltas, whatever else is in the folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from recserve.errors import PackageError
from recserve.runtime.delta import list_stream, manifest_sha256, read_delta
from recserve.runtime.package import read_manifest
from rectrain.durable import sha256_file
from rectrain.safetensors_io import save_tensors
from tests.runtime.delta_common import make_stream


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    stream = make_stream(tmp_path_factory.mktemp("publish"))
    stream.publish_delta(seed=1)
    stream.publish_delta(seed=2, tables=("t1", "t2"))
    return stream


@pytest.fixture
def copy(stream, tmp_path):
    """A copy of delta 1 to spoil."""
    return Path(shutil.copytree(stream.publish / "1-deltas" / "00000001", tmp_path / "00000001"))


def read(stream, path, sequence=1, sha=None):
    base = read_manifest(stream.base)
    return read_delta(path, base, sha or manifest_sha256(stream.base), sequence)


def edit_manifest(path: Path, **changes) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


def rewrite(path: Path, name: str, edit) -> None:
    """Replace a file's tensors by ``edit(tensors)`` and record its new checksum (a writer's bug, not a
    corruption: only the checks behind the checksum can refuse it)."""
    tensors = edit({k: v.clone() for k, v in load_file(str(path / name)).items()})
    (path / name).unlink()  # load_file maps the file: never write into the pages of its tensors
    save_tensors(path / name, tensors)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": sha256_file(path / name), "bytes": (path / name).stat().st_size}
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_deltas_read_in_order(stream):
    base, deltas = list_stream(stream.publish)
    assert base == stream.base and [p.name for p in deltas] == ["00000001", "00000002"]
    first, second = read(stream, deltas[0]), read(stream, deltas[1], 2)
    assert (first.sequence, first.step, first.base_version, second.sequence) == (1, 100, "1", 2)
    assert sorted(first.rows) == ["t0", "t1", "t2", "t3"] and sorted(second.rows) == ["t1", "t2"]
    ids, rows = first.rows["t0"]
    assert ids.dtype == torch.int64 and rows.dtype == torch.uint8 and rows.shape == (ids.numel(), 12)
    assert all(v.dtype == torch.float32 for v in first.dense.values())


def _swap_rows(tensors):
    return {**tensors, "t0.rows": tensors["t0.rows"][:, :8].contiguous()}


def _out_of_range(tensors):
    ids = tensors["t3.ids"].clone()
    ids[-1] = 80
    return {**tensors, "t3.ids": ids}


def _unsorted(tensors):
    return {**tensors, "t1.ids": tensors["t1.ids"].flip(0).contiguous()}


SPOILED = {
    "corrupt file": (
        lambda p: (p / "rows.safetensors").write_bytes((p / "rows.safetensors").read_bytes()[:-1] + b"x"),
        r"rows.safetensors: sha256 .* does not match",
    ),
    "truncated file": (
        lambda p: (p / "dense.safetensors").write_bytes((p / "dense.safetensors").read_bytes()[:-4]),
        r"dense.safetensors: \d+ bytes, but manifest.json records",
    ),
    "extra file": (lambda p: (p / "notes.txt").write_text("x"), r"notes.txt: not listed in manifest.json"),
    "foreign base": (
        lambda p: edit_manifest(p, base_manifest_sha256="0" * 64),
        r"manifest.json: base_manifest_sha256 '0{64}' does not name the base",
    ),
    "other base version": (
        lambda p: edit_manifest(p, base_version="2"),
        r"base_version '2', the base is '1'",
    ),
    "other model": (lambda p: edit_manifest(p, model_name="other"), r"model_name 'other'"),
    "format version": (lambda p: edit_manifest(p, format_version=2), r"format_version 2 is not supported"),
    "table dtype": (
        lambda p: edit_manifest(p, tables={"t0": {"dtype": "int4", "rows": 3}}),
        r"tables\['t0'\].dtype 'int4', the base stores it as 'int8'",
    ),
    "unknown table": (
        lambda p: edit_manifest(p, tables={"t9": {"dtype": "int8", "rows": 1}}),
        r"tables\['t9'\]: the base has no such table",
    ),
    "file set": (
        lambda p: edit_manifest(p, files={"rows.safetensors": {}}),
        r"files: expected exactly \['dense.safetensors', 'rows.safetensors'\]",
    ),
    "row width": (
        lambda p: rewrite(p, "rows.safetensors", _swap_rows),
        r"rows.safetensors: t0.rows: U8 \[\d+, 8\], the base's table needs U8 \[\d+, 12\]",
    ),
    "id out of range": (
        lambda p: rewrite(p, "rows.safetensors", _out_of_range),
        r"rows.safetensors: t3.ids: id 80 is outside the table's rows \[0, 80\)",
    ),
    "unsorted ids": (
        lambda p: rewrite(p, "rows.safetensors", _unsorted),
        r"rows.safetensors: t1.ids: not sorted and unique",
    ),
    "dense dtype": (
        lambda p: rewrite(p, "dense.safetensors", lambda t: {k: v.half() for k, v in t.items()}),
        r"dense.safetensors: .*: dtype F16, the base's dense part is fp32",
    ),
    "missing manifest": (lambda p: (p / "manifest.json").unlink(), r"manifest.json: missing"),
}


@pytest.mark.parametrize("case", list(SPOILED))
def test_spoiled_deltas_are_refused_naming_file_and_field(stream, copy, case):
    spoil, message = SPOILED[case]
    spoil(copy)
    with pytest.raises(PackageError, match=message):
        read(stream, copy)


def test_deltas_apply_in_order_only(stream):
    _, deltas = list_stream(stream.publish)
    with pytest.raises(PackageError, match=r"sequence 2, expected 1 \(deltas apply in order"):
        read(stream, deltas[1], 1)
    with pytest.raises(PackageError, match=r"sequence 1, expected 2"):
        read(stream, deltas[0], 2)
    with pytest.raises(PackageError, match=r"base_manifest_sha256 .* does not name the base"):
        read(stream, deltas[0], 1, sha="f" * 64)


def test_a_folder_named_for_another_sequence_is_refused(stream, tmp_path):
    moved = shutil.copytree(stream.publish / "1-deltas" / "00000001", tmp_path / "00000005")
    with pytest.raises(PackageError, match=r"sequence 1 but the folder is named '00000005'"):
        read(stream, moved)


def _base(directory: Path, number: int) -> Path:
    (directory / str(number)).mkdir(parents=True)
    (directory / str(number) / "manifest.json").write_text("{}")
    return directory / str(number)


def test_list_stream_takes_the_newest_complete_base_and_ignores_the_rest(tmp_path):
    assert list_stream(tmp_path / "nothing") == (None, [])
    _base(tmp_path, 9)
    newest = _base(tmp_path, 10)  # newer by number, older by name
    (tmp_path / "11").mkdir()  # no manifest: not a package
    (tmp_path / ".12.tmp-1").mkdir()  # a writer's staging
    (tmp_path / "13").write_text("a file")
    assert list_stream(tmp_path) == (newest, [])
    deltas = tmp_path / "10-deltas"
    for name in ("00000002", "00000010", "00000001", ".00000011.tmp", "3", "notes"):
        (deltas / name).mkdir(parents=True)
    (tmp_path / "9-deltas" / "00000001").mkdir(parents=True)
    assert list_stream(tmp_path) == (newest, [deltas / "00000001", deltas / "00000002", deltas / "00000010"])


def test_list_stream_tolerates_directories_vanishing(tmp_path, monkeypatch):
    _base(tmp_path, 1)
    newest = _base(tmp_path, 2)
    (tmp_path / "2-deltas" / "00000001").mkdir(parents=True)
    listing = Path.iterdir

    def retire_while_listing(self):
        names = list(listing(self))
        if self == tmp_path:  # a trainer retires base 1 and base 2's deltas between listing and looking
            shutil.rmtree(tmp_path / "1")
            shutil.rmtree(tmp_path / "2-deltas")
        return iter(names)

    monkeypatch.setattr(Path, "iterdir", retire_while_listing)
    assert list_stream(tmp_path) == (newest, [])
