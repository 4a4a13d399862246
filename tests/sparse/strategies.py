"""Hypothesis strategies and a pure-Python reference model for the sparse-type tests.

The reference model is a dict ``{key: [row, row, ...]}`` (each row a list of ids); tests compare a
KeyedJaggedTensor against it, so the expected values never come from the code under test.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from rectrain.sparse import KeyedJaggedTensor

Rows = list[list[int]]


def rows_of_size(size: int) -> st.SearchStrategy[Rows]:
    """Exactly ``size`` rows of 0-4 ids each."""
    return st.lists(st.lists(st.integers(0, 1000), max_size=4), min_size=size, max_size=size)


@st.composite
def kjt_models(draw, max_keys: int = 4, vbe: bool | None = None) -> tuple[dict[str, Rows], bool, bool]:
    """(model, weighted, variable_batch): per-key rows; a shared batch size unless variable_batch."""
    num_keys = draw(st.integers(0, max_keys))
    variable = draw(st.booleans()) if vbe is None else vbe
    batch = draw(st.integers(0, 4))
    model = {}
    for k in range(num_keys):
        size = draw(st.integers(0, 4)) if variable else batch
        model[f"f{k}"] = draw(rows_of_size(size))
    return model, draw(st.booleans()), variable


def weights_of(row: list[int]) -> list[float]:
    """Deterministic per-value weights, so the expected weights follow the ids wherever they move."""
    return [v / 8.0 for v in row]


def build_kjt(model: dict[str, Rows], weighted: bool, variable: bool) -> KeyedJaggedTensor:
    """A KeyedJaggedTensor holding ``model`` (VBE with one rank per key when ``variable``)."""
    keys = list(model)
    lengths = [len(row) for rows in model.values() for row in rows]
    flat = [v for rows in model.values() for row in rows for v in row]
    strides = [len(rows) for rows in model.values()]
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor(flat, dtype=torch.int64),
        weights=torch.tensor(weights_of(flat), dtype=torch.float32) if weighted else None,
        lengths=torch.tensor(lengths, dtype=torch.int32),
        stride=None if variable or not keys else strides[0],
        stride_per_key_per_rank=[[s] for s in strides] if variable else None,
    )


def model_of(kjt: KeyedJaggedTensor) -> dict[str, Rows]:
    """Read a KeyedJaggedTensor back into the reference model using only lengths, values and strides."""
    lengths, values = kjt.lengths().tolist(), kjt.values().tolist()
    model, row, pos = {}, 0, 0
    for key, stride in zip(kjt.keys(), kjt.stride_per_key()):
        rows = []
        for n in lengths[row : row + stride]:
            rows.append(values[pos : pos + n])
            pos += n
        row += stride
        model[key] = rows
    return model


def assert_weights_follow_values(kjt: KeyedJaggedTensor) -> None:
    """With weights built by ``weights_of``, every weight must still sit next to its id."""
    weights = kjt.weights_or_none()
    if weights is not None:
        assert weights.tolist() == weights_of(kjt.values().tolist())
