"""``torchrec.quant.embedding_modules`` at rectrain's path: the quantized ``EmbeddingBagCollection``.

It is recserve's serving lookup (``recserve.runtime.quant_embedding.QuantEmbeddingBagCollection``, FBGEMM's
int-N kernels) built from TorchRec's arguments, with every table whole on one device: one engine for the
quantized lookups of an in-process model and of a served package. ``from_float`` quantizes with export's
own row-wise quantization (``recserve.export.quantize``), so a model quantized here and the same float
model exported at the same dtype hold the same codes and score the same.

Each table's rows live in one host buffer in FBGEMM's CPU row layout (per row: fp16 scale and bias, then
the codes; row alignment 1) that the kernels read in place; ``embedding_bags.<table>.weight`` in the state
dict is a view of it, so ``load_state_dict`` changes what the kernels read. Differences from TorchRec: rows
are not padded to ``row_alignment`` (TorchRec pads to 16 bytes), int4/int2 weights are plain ``uint8``
(TorchRec wraps them in ``UInt4Tensor``/``UInt2Tensor``), the kernels are never registered as submodules
(``register_tbes``), and the collection runs on CPU only (serve on GPUs through an exported package).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from recserve.export.quantize import quantize_table
from recserve.runtime.layout import QuantizedTable, TableDType, dim_problem, row_bytes
from recserve.runtime.placement import ServingPlacement, TableShard
from recserve.runtime.quant_embedding import QuantEmbeddingBagCollection, split_by_placement
from rectrain.embedding.config import DataType, EmbeddingBagConfig, QuantConfig, dtype_to_data_type
from rectrain.errors import ConfigError

# TorchRec's module attributes that its ``quant_prep_*`` helpers set on float modules before the swap.
MODULE_ATTR_REGISTER_TBES_BOOL = "__register_tbes_in_named_modules"
MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS = "__quant_state_dict_split_scale_bias"
MODULE_ATTR_ROW_ALIGNMENT_INT = "__register_row_alignment_in_named_modules"
MODULE_ATTR_CACHE_FEATURES_ORDER = "__cache_features_order"
DEFAULT_ROW_ALIGNMENT = 16

_TABLE_DTYPES = {
    DataType.FP32: TableDType.FP32,
    DataType.FP16: TableDType.FP16,
    DataType.INT8: TableDType.INT8,
    DataType.INT4: TableDType.INT4,
    DataType.INT2: TableDType.INT2,
}


def table_dtype(config: EmbeddingBagConfig) -> TableDType:
    """The serving storage type of ``config.data_type``; ConfigError for one FBGEMM's int-N kernels lack."""
    dtype = _TABLE_DTYPES.get(config.data_type)
    if dtype is None:
        choices = ", ".join(d.name for d in _TABLE_DTYPES)
        raise ConfigError(
            f"table {config.name!r}: data_type {config.data_type.name} has no quantized lookup; "
            f"choose one of {choices}"
        )
    problem = dim_problem(config.embedding_dim, dtype)
    if problem:
        raise ConfigError(f"table {config.name!r}: {problem}")
    return dtype


def _kernel_tables(
    tables: Sequence[EmbeddingBagConfig], weights: dict[str, tuple[Tensor, Tensor | None]] | None
) -> dict[str, QuantizedTable]:
    """Every table's rows in one zeroed host buffer (views of it), filled from ``weights`` when given."""
    dtypes = [table_dtype(t) for t in tables]
    sizes = [t.num_embeddings * row_bytes(t.embedding_dim, d) for t, d in zip(tables, dtypes)]
    flat = torch.zeros(sum(sizes), dtype=torch.uint8)
    out, offset = {}, 0
    for table, dtype, size in zip(tables, dtypes, sizes):
        rows = flat[offset : offset + size].view(table.num_embeddings, -1)
        out[table.name] = QuantizedTable.from_kernel_rows(rows, dtype, table.embedding_dim)
        offset += size
        if weights is None:
            continue
        if table.name not in weights:
            raise ConfigError(f"table_name_to_quantized_weights has no entry for table {table.name!r}")
        codes, scale_bias = weights[table.name]
        given = QuantizedTable(codes, scale_bias, dtype, table.embedding_dim)
        try:
            given.check(f"table_name_to_quantized_weights[{table.name!r}]", table.num_embeddings)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        out[table.name].weights.copy_(codes)
        if scale_bias is not None:
            out[table.name].scale_bias.copy_(scale_bias)
    return out


class EmbeddingBagCollection(QuantEmbeddingBagCollection):
    """``torchrec.quant.embedding_modules.EmbeddingBagCollection``: pooled lookups of quantized tables.

    Args (TorchRec's): ``tables`` (each table's ``data_type`` is its storage: INT8, INT4, INT2, FP16, FP32),
    ``is_weighted``, ``device`` (cpu), ``output_dtype`` (float32, float16, bfloat16),
    ``table_name_to_quantized_weights`` (``{table: (codes uint8, scale_bias uint8 [rows, 4] or None)}``;
    without it the tables are zero until a state dict is loaded), ``quant_state_dict_split_scale_bias``
    (the state dict holds ``weight`` (codes), ``weight_qscale`` and ``weight_qbias`` (fp16 ``[rows, 1]``)
    instead of whole rows). ``register_tbes``, ``row_alignment`` and ``cache_features_order`` are accepted
    (see the module docstring).
    """

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        is_weighted: bool,
        device: torch.device | str,
        output_dtype: torch.dtype = torch.float,
        table_name_to_quantized_weights: dict[str, tuple[Tensor, Tensor | None]] | None = None,
        register_tbes: bool = False,
        quant_state_dict_split_scale_bias: bool = False,
        row_alignment: int = DEFAULT_ROW_ALIGNMENT,
        cache_features_order: bool = False,
    ) -> None:
        device = torch.device(device)
        if device.type != "cpu":
            raise ConfigError(
                f"rectrain.quant.EmbeddingBagCollection(device={device}): quantized collections run on CPU "
                "in process; to serve on GPUs, export a package (recserve.export.export_package(..., "
                "devices=['cuda:0'])) and load it with recserve.runtime.Predictor"
            )
        if output_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ConfigError(
                f"output_dtype {output_dtype}: choose torch.float32, torch.float16 or torch.bfloat16"
            )
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate table names in {names}")
        quantized = _kernel_tables(tables, table_name_to_quantized_weights)
        shards = [TableShard(t.name, "cpu", 0, t.num_embeddings) for t in tables]
        placement = ServingPlacement(["cpu"], "cpu", shards)
        super().__init__(
            tables,
            split_by_placement(quantized, placement),
            placement,
            is_weighted=is_weighted,
            device=device,
            output_dtype=output_dtype,
        )
        self._output_dtype = output_dtype
        self._quantized = quantized
        self.row_alignment = row_alignment
        self.register_tbes = register_tbes
        setattr(self, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, quant_state_dict_split_scale_bias)
        setattr(self, MODULE_ATTR_CACHE_FEATURES_ORDER, cache_features_order)
        self.embedding_bags = nn.ModuleDict()
        for name, table in quantized.items():
            holder = nn.Module()
            if quant_state_dict_split_scale_bias and table.scale_bias is not None:
                holder.register_buffer("weight", table.weights)
                halves = table.scale_bias.view(torch.float16)  # [rows, 2]: scale, bias (views)
                holder.register_buffer("weight_qscale", halves[:, 0:1])
                holder.register_buffer("weight_qbias", halves[:, 1:2])
            else:
                holder.register_buffer("weight", table.rows_view)
            self.embedding_bags[name] = holder

    def quantized_tables(self) -> dict[str, QuantizedTable]:
        """``{table: its rows in serving layout}``, what the kernels read (export writes them as they are)."""
        return dict(self._quantized)

    def output_dtype(self) -> torch.dtype:
        return self._output_dtype

    def _get_name(self) -> str:
        return "QuantizedEmbeddingBagCollection"

    @classmethod
    def from_float(
        cls, module: nn.Module, use_precomputed_fake_quant: bool = False
    ) -> EmbeddingBagCollection:
        """The quantized collection of a float ``EmbeddingBagCollection`` whose ``qconfig`` (a
        ``QuantConfig`` or torch ``QConfig``) gives the storage dtype (``weight()``) and the output dtype
        (``activation()``)."""
        qconfig = getattr(module, "qconfig", None)
        if qconfig is None:
            raise ConfigError(
                "from_float: the EmbeddingBagCollection has no qconfig; quantize it with "
                "rectrain.inference.modules.quantize_embeddings(module, dtype=torch.qint8, inplace=...)"
            )
        per_table = getattr(qconfig, "per_table_weight_dtype", None) or {}
        configs = copy.deepcopy(module.embedding_bag_configs())
        for config in configs:
            config.data_type = dtype_to_data_type(per_table.get(config.name, qconfig.weight().dtype))
        state = module.state_dict()
        weights = {}
        for config in configs:
            weight = state[f"embedding_bags.{config.name}.weight"]
            if weight.is_meta:
                raise ConfigError(
                    f"from_float: table {config.name!r} is on the meta device; materialise the collection "
                    "(to_empty + load_state_dict, or state_dict_gather) before quantizing it"
                )
            quantized = quantize_table(weight, table_dtype(config))
            weights[config.name] = (quantized.weights, quantized.scale_bias)
        return cls(
            configs,
            module.is_weighted(),
            device="cpu",
            output_dtype=qconfig.activation().dtype,
            table_name_to_quantized_weights=weights,
            register_tbes=getattr(module, MODULE_ATTR_REGISTER_TBES_BOOL, False),
            quant_state_dict_split_scale_bias=getattr(
                module, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, False
            ),
            row_alignment=getattr(module, MODULE_ATTR_ROW_ALIGNMENT_INT, DEFAULT_ROW_ALIGNMENT),
            cache_features_order=getattr(module, MODULE_ATTR_CACHE_FEATURES_ORDER, False),
        )


def for_each_module_of_type_do(
    module: nn.Module, module_types: Sequence[type[nn.Module]], op: Callable[[nn.Module], Any]
) -> None:
    """Call ``op`` on every submodule of ``module`` whose type is exactly one of ``module_types``."""
    for submodule in module.modules():
        if type(submodule) in module_types:
            op(submodule)


def quant_prep_enable_quant_state_dict_split_scale_bias(module: nn.Module) -> None:
    setattr(module, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, True)


def quant_prep_enable_quant_state_dict_split_scale_bias_for_types(
    module: nn.Module, module_types: list[type[nn.Module]]
) -> None:
    for_each_module_of_type_do(module, module_types, quant_prep_enable_quant_state_dict_split_scale_bias)


def quant_prep_enable_register_tbes(module: nn.Module, module_types: list[type[nn.Module]]) -> None:
    for_each_module_of_type_do(
        module, module_types, lambda m: setattr(m, MODULE_ATTR_REGISTER_TBES_BOOL, True)
    )


def quant_prep_customize_row_alignment(
    module: nn.Module, module_types: list[type[nn.Module]], row_alignment: int
) -> None:
    for_each_module_of_type_do(
        module, module_types, lambda m: setattr(m, MODULE_ATTR_ROW_ALIGNMENT_INT, row_alignment)
    )


def quant_prep_enable_cache_features_order(module: nn.Module, module_types: list[type[nn.Module]]) -> None:
    for_each_module_of_type_do(
        module, module_types, lambda m: setattr(m, MODULE_ATTR_CACHE_FEATURES_ORDER, True)
    )


__all__ = [
    "DEFAULT_ROW_ALIGNMENT",
    "EmbeddingBagCollection",
    "QuantConfig",
    "for_each_module_of_type_do",
    "quant_prep_customize_row_alignment",
    "quant_prep_enable_cache_features_order",
    "quant_prep_enable_quant_state_dict_split_scale_bias",
    "quant_prep_enable_quant_state_dict_split_scale_bias_for_types",
    "quant_prep_enable_register_tbes",
    "table_dtype",
]
