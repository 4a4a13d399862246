"""Streamed safetensors files: written in pieces from tensors' own memory, read a slice at a time, and
readable by the safetensors library itself."""

from __future__ import annotations

import hashlib

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from rectrain.safetensors_io import (
    ALIGN,
    SafetensorsFile,
    SafetensorsFormatError,
    SafetensorsWriter,
    TensorSpec,
    save_tensors,
    tensors_of_bytes,
)


def test_written_in_pieces_reads_back_with_safetensors(tmp_path) -> None:
    weight = torch.randn(100, 12)
    state = torch.rand(100)
    path = tmp_path / "x.safetensors"
    specs = [
        TensorSpec("w", torch.float32, (100, 12)),
        TensorSpec("s", torch.float32, (100,)),
        TensorSpec("step", torch.int64, ()),
    ]
    with SafetensorsWriter(path, specs, metadata={"format": "pt"}) as writer:
        writer.write("w", weight[60:], row_offset=60)
        writer.write("w", weight[:60].t().contiguous().t())  # not contiguous: staged in chunks
        writer.write("s", state)
        writer.write("step", torch.tensor(7))
    with safe_open(str(path), framework="pt") as handle:
        assert torch.equal(handle.get_tensor("w"), weight)
        assert torch.equal(handle.get_tensor("s"), state)
        assert int(handle.get_tensor("step")) == 7
        assert handle.metadata() == {"format": "pt"}
    assert writer.data_start % ALIGN == 0


def test_reads_rows_and_columns_into_a_view(tmp_path) -> None:
    weight = torch.randn(50, 8)
    path = tmp_path / "y.safetensors"
    save_file({"w": weight, "b": torch.arange(3)}, str(path))
    target = torch.zeros(20, 16)
    with SafetensorsFile(path) as stored:
        stored.read_into("w", target[:, 4:8], rows=(10, 30), cols=(2, 6))
        assert torch.equal(stored.read("b"), torch.arange(3))
        assert torch.equal(stored.read_rows("w", 5, 2), weight[5:7])
    assert torch.equal(target[:, 4:8], weight[10:30, 2:6])
    assert target[:, :4].abs().sum() == 0 and target[:, 8:].abs().sum() == 0


def test_unwritten_tensor_and_bad_header_are_named(tmp_path) -> None:
    path = tmp_path / "z.safetensors"
    writer = SafetensorsWriter(
        path, [TensorSpec("a", torch.float32, (2,)), TensorSpec("b", torch.uint8, (3,))]
    )
    writer.write("a", torch.ones(2))
    with pytest.raises(SafetensorsFormatError, match=r"\['b'\] were declared but not written"):
        writer.close()
    assert not path.exists()
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(SafetensorsFormatError, match="header is not JSON"):
        SafetensorsFile(path)


def test_save_tensors_round_trip(tmp_path) -> None:
    tensors = {"a": torch.randn(3, 4).half(), "b": torch.tensor([True, False]), "c": torch.empty(0, 5)}
    save_tensors(tmp_path / "t.safetensors", tensors)
    with SafetensorsFile(tmp_path / "t.safetensors") as stored:
        for name, value in tensors.items():
            assert torch.equal(stored.read(name), value)


def test_save_tensors_hashes_what_it_writes_and_bytes_parse_as_views(tmp_path) -> None:
    tensors = {"ids": torch.arange(5), "rows": torch.randint(0, 255, (5, 13), dtype=torch.uint8)}
    digest = hashlib.sha256()
    save_tensors(tmp_path / "t.safetensors", tensors, {"format": "pt"}, digest)
    data = bytearray((tmp_path / "t.safetensors").read_bytes())
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    parsed = tensors_of_bytes(data, tmp_path / "t.safetensors")
    assert all(torch.equal(parsed[k], v) for k, v in tensors.items())
    data[-1] ^= 1  # views of the bytes, not copies
    assert parsed["rows"][-1, -1] == tensors["rows"][-1, -1] ^ 1
    with pytest.raises(SafetensorsFormatError, match=r"t\.safetensors: cannot be read as safetensors"):
        tensors_of_bytes(bytearray(b"\x05"), tmp_path / "t.safetensors")
