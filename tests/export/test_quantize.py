"""Row-wise quantization: FBGEMM's layout, and the error bound each dtype's format implies."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from recserve.errors import ExportError
from recserve.export.quantize import (
    check_dim,
    dequantize_table,
    quantize_kernel_rows,
    quantize_table,
    scale_and_bias,
)
from recserve.runtime.layout import SCALE_BIAS_BYTES, TableDType, kernel_rows, row_bytes

INT_TYPES = [TableDType.INT8, TableDType.INT4, TableDType.INT2]


@st.composite
def tables(draw):
    rows = draw(st.integers(1, 40))
    dim = 8 * draw(st.integers(1, 8))
    scale = draw(st.sampled_from([1e-3, 0.05, 1.0, 30.0]))
    seed = draw(st.integers(0, 2**16))
    weight = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)) * scale
    if draw(st.booleans()):
        weight[0] = weight[0, 0]  # a constant row: zero range
    return weight


@given(weight=tables(), dtype=st.sampled_from(INT_TYPES))
def test_integer_error_within_half_a_step_plus_fp16_rounding(weight, dtype):
    """|x - dequant(x)| <= scale/2 per row, plus the fp16 rounding of bias (the row min) and of scale times
    the largest code (scale, bias are stored in fp16: relative error 2^-11, absolute 2^-25 if subnormal)."""
    table = quantize_table(weight, dtype)
    error = (dequantize_table(table) - weight).abs().max(dim=1).values
    scale, _ = scale_and_bias(table)
    lo, hi = weight.min(dim=1).values, weight.max(dim=1).values
    codes = 2**dtype.bits - 1
    fp16_rel, fp16_abs = 2.0**-11, 2.0**-25
    bias_rounding = torch.maximum(lo.abs() * fp16_rel, torch.tensor(fp16_abs))
    scale_rounding = torch.maximum((hi - lo) * fp16_rel, torch.tensor(codes * fp16_abs))
    bound = scale / 2 + bias_rounding + scale_rounding + 1e-7
    assert bool((error <= bound).all()), (error - bound).max()


@given(weight=tables())
def test_fp16_is_a_cast_and_fp32_is_exact(weight):
    fp16 = dequantize_table(quantize_table(weight, "fp16"))
    assert torch.equal(fp16, weight.half().float())
    assert torch.equal(dequantize_table(quantize_table(weight, "fp32")), weight)


@pytest.mark.parametrize("dtype", list(TableDType))
def test_layout_is_fbgemm_rows(dtype):
    weight = torch.randn(7, 16)
    table = quantize_table(weight, dtype)
    assert table.weights.dtype == torch.uint8
    assert tuple(table.weights.shape) == (7, 16 * dtype.bits // 8)
    assert table.nbytes == 7 * row_bytes(16, dtype)
    if dtype.is_integer:
        assert tuple(table.scale_bias.shape) == (7, SCALE_BIAS_BYTES)
        # FBGEMM's fused row = codes + fp16 scale + fp16 bias; our split must re-fuse to exactly that.
        fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(weight, dtype.bits)
        assert torch.equal(torch.cat([table.weights, table.scale_bias], dim=1), fused)
    else:
        assert table.scale_bias is None


def test_row_shard_is_a_view_of_the_rows():
    table = quantize_table(torch.randn(10, 8), "int4")
    shard = table.rows(3, 7)
    assert shard.num_embeddings == 4
    assert torch.equal(dequantize_table(shard), dequantize_table(table)[3:7])


def test_bad_dtype_and_dim_are_named():
    with pytest.raises(ExportError, match="unknown table dtype 'int3'.*int8, int4"):
        quantize_table(torch.randn(2, 8), "int3")
    with pytest.raises(ExportError, match="table 'big': embedding_dim 6 is not a multiple of 4"):
        check_dim("big", 6, TableDType.INT8)
    with pytest.raises(ExportError, match="table 't': embedding_dim 12 is not a multiple of 8"):
        check_dim("t", 12, TableDType.INT2)
    check_dim("t", 12, TableDType.INT4)


@given(weight=tables(), dtype=st.sampled_from(list(TableDType)))
def test_kernel_rows_in_one_step_are_the_export_s_bytes(weight, dtype):
    """What a delta publishes for a row is byte for byte what an export stores for it."""
    table = quantize_table(weight, dtype)
    got = quantize_kernel_rows(weight, dtype)
    assert got.is_contiguous()
    assert torch.equal(got, kernel_rows(table.weights, table.scale_bias))
