"""Properties of re-sharding reads and of the pickle-free optimizer state encoding."""

from __future__ import annotations

import json

import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from rectrain.checkpoint.files import sha256_of
from rectrain.checkpoint.manifest import PER_ELEMENT, PER_ROW, Manifest, ShardEntry, StateEntry
from rectrain.checkpoint.optimizer_state import flatten, unflatten
from rectrain.checkpoint.reader import CheckpointReader
from rectrain.planner.types import Shard


def _cuts(draw, total: int) -> list[int]:
    inner = draw(st.lists(st.integers(1, total - 1), max_size=3, unique=True)) if total > 1 else []
    return [0, *sorted(inner), total]


@st.composite
def layouts(draw):
    rows, cols = draw(st.integers(1, 12)), draw(st.integers(1, 6))
    row_cuts, col_cuts = _cuts(draw, rows), _cuts(draw, cols)
    r0 = draw(st.integers(0, rows - 1))
    c0 = draw(st.integers(0, cols - 1))
    target = Shard(r0, draw(st.integers(1, rows - r0)), c0, draw(st.integers(1, cols - c0)))
    return rows, cols, row_cuts, col_cuts, target


def _write(tmp, full: torch.Tensor, per_row: torch.Tensor, row_cuts, col_cuts) -> CheckpointReader:
    """Save ``full`` as a grid of shards (one file per shard) and per-row state per shard."""
    weight, momentum, files = StateEntry(PER_ELEMENT, "float32"), StateEntry(PER_ROW, "float32"), {}
    for i, (a, b) in enumerate(zip(row_cuts, row_cuts[1:])):
        for j, (c, d) in enumerate(zip(col_cuts, col_cuts[1:])):
            name = f"s{i}_{j}.safetensors"
            save_file({"w": full[a:b, c:d].contiguous(), "m": per_row[j, a:b].contiguous()}, str(tmp / name))
            files[name] = sha256_of(tmp / name)
            for entry, tensor, shape in ((weight, "w", (b - a, d - c)), (momentum, "m", (b - a,))):
                entry.shards.append(ShardEntry(name, tensor, a, b - a, c, d - c, shape, 0))
    manifest = Manifest(step=0, world_size=1, tables={}, dense_params={}, files=files)
    return CheckpointReader(tmp, manifest), weight, momentum


@given(layouts())
def test_any_rectangle_reads_back_from_any_shard_grid(tmp_path_factory, layout):
    rows, cols, row_cuts, col_cuts, target = layout
    tmp = tmp_path_factory.mktemp("grid")
    full = torch.randn(rows, cols)
    per_row = torch.rand(len(col_cuts) - 1, rows)  # one accumulator per column shard and row
    reader, weight, momentum = _write(tmp, full, per_row, row_cuts, col_cuts)
    with reader:
        got = reader.read(weight, target, "w")
        assert torch.equal(
            got, full[target.row_offset :, target.col_offset :][: target.num_rows, : target.num_cols]
        )
        # Row-wise state: mean of the overlapping column shards, weighted by overlapping columns.
        lo, hi = target.col_offset, target.col_offset + target.num_cols
        widths = torch.tensor(
            [max(0, min(d, hi) - max(c, lo)) for c, d in zip(col_cuts, col_cuts[1:])], dtype=torch.float64
        )
        rows_slice = slice(target.row_offset, target.row_offset + target.num_rows)
        expected = (per_row[:, rows_slice].double() * widths[:, None]).sum(0) / widths.sum()
        torch.testing.assert_close(reader.read(momentum, target, "m"), expected.float(), rtol=1e-6, atol=0)
        if (widths > 0).sum() == 1:  # one contributing shard: copied bitwise
            assert torch.equal(reader.read(momentum, target, "m"), per_row[int(widths.argmax()), rows_slice])


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=4)
)
trees = st.recursive(
    scalars | st.builds(lambda n: torch.arange(n, dtype=torch.float32), st.integers(0, 4)),
    lambda children: (
        st.lists(children, max_size=3)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.integers(0, 9) | st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=10,
)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


@given(trees)
def test_optimizer_state_round_trips_through_json_and_tensors(tree):
    tensors: dict[str, torch.Tensor] = {}
    encoded = json.loads(json.dumps(flatten(tree, "optim", tensors, copy=True)))
    assert _same(unflatten(encoded, tensors.__getitem__), tree)
