"""The serving row layout of a quantized table, shared by export (writes it) and the runtime (reads it).

A table is two uint8 tensors: ``weights [rows, dim * bits / 8]`` (packed integer codes; for fp16/fp32 the raw
little-endian bytes of each row) and, for the integer types, ``scale_bias [rows, 4]`` (fp16 scale then fp16
bias of each row); a row dequantizes as ``scale * code + bias``. On the CPU, FBGEMM's
``IntNBitTableBatchedEmbeddingBagsCodegen`` stores each row as ``scale_bias`` then ``weights`` with no
padding (row alignment 1): the *kernel rows* ``[rows, kernel_row_bytes]`` that a package stores, so that the
kernel reads the package's own bytes (``QuantizedTable.rows``, a view of the mapped file).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, unique

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from torch import Tensor

from recserve.errors import ExportError

SCALE_BIAS_BYTES = 4  # fp16 scale + fp16 bias per row


@unique
class TableDType(Enum):
    """Storage type of a serving table (the names used on the command line and in the manifest)."""

    INT8 = "int8"
    INT4 = "int4"
    INT2 = "int2"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def bits(self) -> int:
        return {"int8": 8, "int4": 4, "int2": 2, "fp16": 16, "fp32": 32}[self.value]

    @property
    def is_integer(self) -> bool:
        return self.bits <= 8

    @property
    def sparse_type(self) -> SparseType:
        """FBGEMM's name for this storage type."""
        return SparseType(self.value)

    @classmethod
    def parse(cls, value: str | TableDType, where: str = "dtype") -> TableDType:
        """``value`` as a TableDType, or an ExportError naming ``where`` and the choices."""
        if isinstance(value, TableDType):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            choices = ", ".join(d.value for d in cls)
            raise ExportError(f"{where}: unknown table dtype {value!r}; choose one of {choices}") from None


def dim_problem(dim: int, dtype: TableDType) -> str | None:
    """Why FBGEMM's ``dtype`` kernels cannot serve rows of ``dim`` (None if they can): dims must be positive
    multiples of 4, with whole fp16 words of codes per row (so int2 needs multiples of 8)."""
    multiple = max(4, 16 // dtype.bits)
    if dim <= 0:
        return f"embedding_dim {dim} must be positive"
    if dim % multiple:
        return (
            f"embedding_dim {dim} is not a multiple of {multiple}, which FBGEMM's "
            f"{dtype.value} lookup kernels require"
        )
    return None


def kernel_rows(weights: Tensor, scale_bias: Tensor | None) -> Tensor:
    """``[rows, kernel_row_bytes]``: each row's scale/bias (integer types) followed by its codes."""
    return weights.contiguous() if scale_bias is None else torch.cat([scale_bias, weights], dim=1)


def row_bytes(dim: int, dtype: TableDType) -> int:
    """Bytes of one stored row (codes plus scale/bias), before any kernel alignment padding."""
    return dim * dtype.bits // 8 + (SCALE_BIAS_BYTES if dtype.is_integer else 0)


@dataclass
class QuantizedTable:
    """One table (or row range of one) in serving layout."""

    weights: Tensor
    scale_bias: Tensor | None
    dtype: TableDType
    embedding_dim: int
    rows_view: Tensor | None = None  # the kernel rows, when weights and scale_bias are views of them

    @classmethod
    def from_kernel_rows(cls, rows: Tensor, dtype: TableDType, dim: int) -> QuantizedTable:
        """The table whose kernel rows are ``rows`` (views of it: nothing is copied)."""
        if not dtype.is_integer:
            return cls(rows, None, dtype, dim, rows)
        return cls(rows[:, SCALE_BIAS_BYTES:], rows[:, :SCALE_BIAS_BYTES], dtype, dim, rows)

    @property
    def num_embeddings(self) -> int:
        return self.weights.shape[0]

    @property
    def nbytes(self) -> int:
        return self.weights.numel() + (0 if self.scale_bias is None else self.scale_bias.numel())

    def rows(self, start: int, end: int) -> QuantizedTable:
        """Rows ``[start, end)`` as their own table (a row-wise serving shard); views, no copy."""
        scale_bias = None if self.scale_bias is None else self.scale_bias[start:end]
        rows = None if self.rows_view is None else self.rows_view[start:end]
        return QuantizedTable(self.weights[start:end], scale_bias, self.dtype, self.embedding_dim, rows)

    def check(self, where: str, num_rows: int | None = None) -> None:
        """Raise ValueError naming ``where`` unless the tensors are uint8 with the shapes the dtype implies
        (and ``num_rows`` rows, when given): the kernels copy these bytes as rows of that width."""
        width = self.embedding_dim * self.dtype.bits // 8
        rows = self.weights.shape[0] if num_rows is None else num_rows
        ok = tuple(self.weights.shape) == (rows, width) and self.weights.dtype == torch.uint8
        if self.dtype.is_integer:
            sb = self.scale_bias
            ok = (
                ok
                and sb is not None
                and tuple(sb.shape) == (rows, SCALE_BIAS_BYTES)
                and sb.dtype == torch.uint8
            )
        else:
            ok = ok and self.scale_bias is None
        if not ok:
            sb = self.scale_bias
            sb_shape = None if sb is None else f"{tuple(sb.shape)} {sb.dtype}"
            raise ValueError(
                f"{where}: {self.dtype.value} table of dim {self.embedding_dim} needs uint8 weights "
                f"[{rows}, {width}]{f' and scale_bias [{rows}, 4]' if self.dtype.is_integer else ''}; got "
                f"weights {tuple(self.weights.shape)} {self.weights.dtype}, scale_bias {sb_shape}"
            )
