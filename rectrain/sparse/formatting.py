"""``str()`` of the sparse types, in TorchRec's layout (rows as nested lists, one key per line)."""

from __future__ import annotations

from torch import Tensor


def _rows_text(values: Tensor, bounds: list[int], first: int, last: int) -> str:
    """Rows ``first..last-1`` of jagged ``values`` (row r spans ``bounds[r]:bounds[r + 1]``) as a list."""
    if values.dim() > 2:
        raise ValueError(
            f"cannot print values of {values.dim()} dimensions (shape {tuple(values.shape)}); "
            "printing supports 1-D and 2-D values"
        )
    rows = [str(values[bounds[r] : bounds[r + 1]].tolist()) for r in range(first, last)]
    return "[" + ", ".join(rows) + "]"


def jagged_text(values: Tensor, weights: Tensor | None, offsets: Tensor) -> str:
    """``JaggedTensor({...})`` with one list of rows (plus one of weights, when weighted)."""
    bounds = offsets.tolist()
    rows = _rows_text(values, bounds, 0, len(bounds) - 1)
    if weights is None:
        return "JaggedTensor({\n    " + rows + "\n})\n"
    weight_rows = _rows_text(weights, bounds, 0, len(bounds) - 1)
    return 'JaggedTensor({\n    "values": ' + rows + ',\n    "weights": ' + weight_rows + "\n})\n"


def keyed_jagged_text(
    keys: list[str], values: Tensor, weights: Tensor | None, offsets: Tensor, stride_per_key: list[int]
) -> str:
    """``KeyedJaggedTensor({...})`` with one line (or, weighted, one block) per key."""
    if not keys:
        return "KeyedJaggedTensor()\n"
    bounds = offsets.tolist()
    parts, first = [], 0
    for key, stride in zip(keys, stride_per_key):
        rows = _rows_text(values, bounds, first, first + stride)
        if weights is None:
            parts.append(f'    "{key}": {rows}')
        else:
            weight_rows = _rows_text(weights, bounds, first, first + stride)
            parts.append(
                f'    "{key}": {{\n        "values": {rows},\n        "weights": {weight_rows}\n    }}'
            )
        first += stride
    return "KeyedJaggedTensor({\n" + ",\n".join(parts) + "\n})\n"


def keyed_text(keys: list[str], per_key: list[Tensor]) -> str:
    """``KeyedTensor({...})`` with each key's dense slice as nested lists."""
    if not keys:
        return "KeyedTensor()\n"
    parts = [f'    "{key}": {tensor.tolist()}' for key, tensor in zip(keys, per_key)]
    return "KeyedTensor({\n" + ",\n".join(parts) + "\n})\n"
