"""Row-wise quantization of float tables into the serving layout (``recserve.runtime.layout``).

Integer types use FBGEMM's own quantize op, ``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf``: per row,
``scale = (max - min) / (2^bits - 1)`` and ``bias = min``, both stored as fp16, codes ``round((x - bias) /
scale)``. The fused row it returns ends in scale and bias; they are split off into ``scale_bias``.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)
import torch
from torch import Tensor

from recserve.errors import ExportError
from recserve.runtime.layout import SCALE_BIAS_BYTES, QuantizedTable, TableDType, dim_problem


def check_dim(table: str, dim: int, dtype: TableDType) -> None:
    """ExportError unless FBGEMM's ``dtype`` kernels serve rows of ``dim`` (see ``layout.dim_problem``)."""
    problem = dim_problem(dim, dtype)
    if problem:
        raise ExportError(f"table {table!r}: {problem}; choose another --table-dtype for it")


def quantize_table(weight: Tensor, dtype: TableDType | str) -> QuantizedTable:
    """Quantize a float ``[rows, dim]`` table row-wise (int types) or cast it (fp16/fp32); on CPU."""
    dtype = TableDType.parse(dtype)
    if weight.dim() != 2:
        raise ExportError(f"a table weight must be 2-D [rows, dim], got shape {tuple(weight.shape)}")
    weight = weight.detach().to("cpu", torch.float32).contiguous()
    dim = weight.shape[1]
    if dtype is TableDType.FP32:
        return QuantizedTable(weight.view(torch.uint8), None, dtype, dim)
    if dtype is TableDType.FP16:
        return QuantizedTable(weight.half().view(torch.uint8), None, dtype, dim)
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(weight, dtype.bits)
    codes = fused[:, :-SCALE_BIAS_BYTES].contiguous()
    scale_bias = fused[:, -SCALE_BIAS_BYTES:].contiguous()
    return QuantizedTable(codes, scale_bias, dtype, dim)


def quantize_kernel_rows(weight: Tensor, dtype: TableDType | str) -> Tensor:
    """The kernel rows (``layout.kernel_rows``) of ``quantize_table(weight, dtype)``, made with one copy of
    the quantized bytes instead of three (codes and scale/bias split off, then joined): what a delta
    publishes for its changed rows, the same bytes a full export stores for them."""
    dtype = TableDType.parse(dtype)
    if not dtype.is_integer:
        return quantize_table(weight, dtype).weights
    if weight.dim() != 2:
        raise ExportError(f"a table weight must be 2-D [rows, dim], got shape {tuple(weight.shape)}")
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(
        weight.detach().to("cpu", torch.float32).contiguous(), dtype.bits
    )
    # fused rows are [codes | scale, bias]; kernel rows are [scale, bias | codes]
    return torch.roll(fused, SCALE_BIAS_BYTES, dims=1)


def dequantize_table(table: QuantizedTable) -> Tensor:
    """The float32 ``[rows, dim]`` values a lookup of ``table`` sees (FBGEMM's own dequantize op)."""
    if table.dtype is TableDType.FP32:
        return table.weights.view(torch.float32).clone()
    if table.dtype is TableDType.FP16:
        return table.weights.view(torch.float16).float()
    assert table.scale_bias is not None, "integer tables carry scale_bias"
    fused = torch.cat([table.weights, table.scale_bias], dim=1)
    return torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloat(fused, table.dtype.bits)


def scale_and_bias(table: QuantizedTable) -> tuple[Tensor, Tensor]:
    """Per-row float32 ``(scale, bias)`` of an integer table."""
    assert table.scale_bias is not None, "only integer tables have scale and bias"
    halves = table.scale_bias.view(torch.float16).float()
    return halves[:, 0], halves[:, 1]
