"""``write_delta``: layout and manifest, rows byte-equal to a full export's, dense state converted as export
converts it, and bad input refused with the table or field named and nothing published."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from recserve.errors import ExportError
from recserve.export.delta import delta_dir, write_delta
from recserve.export.quantize import quantize_table
from recserve.runtime.delta import list_stream, manifest_sha256
from recserve.runtime.layout import kernel_rows
from recserve.runtime.package import load_shards, read_manifest
from rectrain.durable import sha256_file
from tests.runtime.delta_common import CFG, changed, dense_of, make_stream


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    return make_stream(tmp_path_factory.mktemp("publish"), dtype="int8", table_dtypes={"t3": "int4"})


def test_layout_manifest_and_checksums(tmp_path):
    stream = make_stream(tmp_path / "publish")
    path = stream.publish_delta(seed=3, tables=("t0", "t2"))
    assert path == delta_dir(stream.publish, "1", 1) == stream.publish / "1-deltas" / "00000001"
    assert list_stream(stream.publish) == (stream.base, [path])
    assert not [p for p in stream.publish.iterdir() if p.name.startswith(".")]  # no staging left behind
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "recserve-model-delta" and manifest["format_version"] == 1
    assert manifest["model_name"] == "model" and manifest["base_version"] == "1"
    assert manifest["base_manifest_sha256"] == manifest_sha256(stream.base)
    assert (manifest["sequence"], manifest["step"], manifest["wall_time"]) == (1, 100, 1e9 + 1)
    assert set(manifest["tables"]) == {"t0", "t1", "t2", "t3"}
    assert manifest["tables"]["t1"] == {"dtype": "int8", "rows": 0}
    assert sorted(manifest["files"]) == ["dense.safetensors", "rows.safetensors"]
    for name, entry in manifest["files"].items():
        assert entry == {"sha256": sha256_file(path / name), "bytes": (path / name).stat().st_size}
    rows = load_file(str(path / "rows.safetensors"))
    assert sorted(rows) == ["t0.ids", "t0.rows", "t2.ids", "t2.rows"]
    assert manifest["tables"]["t0"]["rows"] == rows["t0.ids"].numel()


def test_rows_are_the_bytes_a_full_export_stores(tmp_path, stream):
    path = stream.publish_delta(seed=4)
    full = stream.full_export(tmp_path / "full")
    shards = load_shards(full, read_manifest(full))
    rows = load_file(str(path / "rows.safetensors"))
    for table in CFG.tables:
        ids = rows[f"{table.name}.ids"]
        assert torch.equal(ids, torch.sort(ids).values) and ids.unique().numel() == ids.numel()
        (whole,) = [q for s, q in shards.items() if s.table == table.name]
        assert torch.equal(rows[f"{table.name}.rows"], whole.rows_view[ids])
    assert read_manifest(stream.base).table("t3").dtype.value == "int4"


def test_rows_quantized_by_the_caller_are_written_as_they_are(tmp_path):
    """A trainer rank quantizes its own rows (``quantize_table`` then ``kernel_rows``): the delta holds the
    same bytes as when ``write_delta`` quantizes the fp32 rows; kernel rows of another width are refused."""
    stream = make_stream(tmp_path / "publish", dtype="int8", table_dtypes={"t3": "int4"})
    rows, dense = _good(stream)
    dtypes = {t.name: t.dtype for t in read_manifest(stream.base).tables}
    quantized = {}
    for name, (ids, weight) in rows.items():
        table = quantize_table(weight, dtypes[name])
        quantized[name] = (ids, kernel_rows(table.weights, table.scale_bias))
    ours = load_file(str(write_delta(stream.publish, "1", 1, 1, quantized, dense) / "rows.safetensors"))
    theirs = load_file(str(write_delta(stream.publish, "1", 2, 1, rows, dense) / "rows.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    wrong = {**quantized, "t3": (quantized["t3"][0], quantized["t3"][1][:, :-1])}
    with pytest.raises(ExportError, match=r"rows\['t3'\]: rows must be \[\d+, \d+\] \(one kernel row"):
        write_delta(stream.publish, "1", 3, 1, wrong, dense)


def test_dense_state_is_stored_in_the_base_dense_dtype(tmp_path):
    stream = make_stream(tmp_path / "publish", dense_dtype="bf16")
    path = stream.publish_delta(seed=5)
    dense = load_file(str(path / "dense.safetensors"))
    want = dense_of(CFG, stream.states[-1])
    assert dense.keys() == want.keys()
    assert all(torch.equal(dense[k], want[k].to(torch.bfloat16)) for k in want)


def _good(stream):
    state, rows = changed(CFG, stream.states[-1], seed=9)
    return rows, dense_of(CFG, state)


BAD_ROWS = {
    "unknown table": (lambda r: {**r, "t9": r["t0"]}, r"rows: unknown table 't9'"),
    "wrong dim": (lambda r: {**r, "t1": (r["t1"][0], r["t1"][1][:, :4])}, r"rows\['t1'\]: rows must be"),
    "id below range": (
        lambda r: {**r, "t2": (torch.cat([r["t2"][0][:-1], torch.tensor([-1])]), r["t2"][1])},
        r"rows\['t2'\]: id -1 is outside the table's rows \[0, 120\)",
    ),
    "id above range": (
        lambda r: {**r, "t3": (torch.cat([r["t3"][0][:-1], torch.tensor([80])]), r["t3"][1])},
        r"rows\['t3'\]: id 80 is outside",
    ),
    "duplicate ids": (
        lambda r: {**r, "t0": (torch.cat([r["t0"][0][:-1], r["t0"][0][:1]]), r["t0"][1])},
        r"rows\['t0'\]: id \d+ appears more than once",
    ),
    "float ids": (lambda r: {**r, "t0": (r["t0"][0].float(), r["t0"][1])}, r"rows\['t0'\]: ids must be"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_rows_are_refused_and_nothing_is_published(stream, case):
    rows, dense = _good(stream)
    edit, message = BAD_ROWS[case]
    before = list_stream(stream.publish)
    with pytest.raises(ExportError, match=message):
        write_delta(stream.publish, "1", len(before[1]) + 1, 1, edit(rows), dense)
    assert list_stream(stream.publish) == before
    assert not [p for p in stream.publish.iterdir() if p.name.startswith(".")]


def test_bad_dense_state_sequence_and_base_are_refused(stream):
    rows, dense = _good(stream)
    key = next(iter(dense))
    nxt = len(list_stream(stream.publish)[1]) + 1
    with pytest.raises(ExportError, match=rf"dense_state: .*missing \['{key}'\]"):
        write_delta(stream.publish, "1", nxt, 1, rows, {k: v for k, v in dense.items() if k != key})
    with pytest.raises(ExportError, match=rf"dense_state\['{key}'\]: shape"):
        write_delta(stream.publish, "1", nxt, 1, rows, {**dense, key: dense[key][:1]})
    with pytest.raises(ExportError, match="sequence must be an integer >= 1"):
        write_delta(stream.publish, "1", 0, 1, rows, dense)
    with pytest.raises(ExportError, match="base_version '7'"):
        write_delta(stream.publish, "7", 1, 1, rows, dense)
    shutil.copytree(stream.base, stream.publish / "5")
    with pytest.raises(ExportError, match="its manifest's version is '1'"):
        write_delta(stream.publish, "5", 1, 1, rows, dense)
    shutil.rmtree(stream.publish / "5")
    published = write_delta(stream.publish, "1", nxt, 1, rows, dense)
    with pytest.raises(ExportError, match="already published"):
        write_delta(stream.publish, "1", nxt, 1, rows, dense)
    assert list_stream(stream.publish)[1][-1] == published
