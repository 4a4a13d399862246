"""``export_package`` / ``export_checkpoint``: trained weights -> a quantized, placed, checked model package.

Order of work: check the weights against the architecture config; plan the serving placement; cast the dense
part; then table by table, a slice of rows at a time: read, quantize, write into the staged package (keeping
the rows the accuracy sample reads); measure accuracy against fp32 on those rows (refuse above the threshold
unless forced: the staged package is dropped); publish the package atomically. Memory: one slice of one
table, whatever the model's size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import recserve
from recserve.errors import AccuracyError, ExportError
from recserve.export.accuracy import AccuracySample, accuracy_report, synthetic_sample
from recserve.export.planner import TableLoad, plan_placement
from recserve.export.prune import (
    PrunedTable,
    PrunePolicy,
    plan_pruning,
    pruning_record,
    stream_pruned_table,
    traffic_sample,
)
from recserve.export.quantize import check_dim, dequantize_table, quantize_table
from recserve.export.sample_rows import CompactSample, compact_sample
from recserve.export.sources import CheckpointSource, StateDictSource, TableSource
from recserve.export.torchrec_import import import_module, quantized_tables_of
from recserve.export.writer import PackageWriter
from recserve.runtime.assembly import build_skeleton, dense_state_keys, table_weight_key
from recserve.runtime.dense_bounds import ACTIONS, WIDEN, bounds_from_range
from recserve.runtime.layout import QuantizedTable, TableDType, kernel_rows, row_bytes
from recserve.runtime.package import PackageManifest, TableEntry
from recserve.runtime.predictor import DENSE_DTYPES, metadata_for
from recserve.runtime.pruning import PRUNED_FORMAT_VERSION
from rectrain.models.config import ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_AUC_DROP = 0.005
_SLICE_BYTES = 64 * 2**20  # fp32 rows read and quantized at once


def resolve_table_dtypes(
    cfg: ModelConfig, dtype: str, table_dtypes: Mapping[str, str] | None
) -> dict[str, TableDType]:
    """Each table's storage dtype: ``dtype`` unless ``table_dtypes`` names the table."""
    names = [t.name for t in cfg.tables]
    unknown = sorted(set(table_dtypes or {}) - set(names))
    if unknown:
        raise ExportError(f"table_dtypes names unknown tables {unknown}; the model's tables are {names}")
    default = TableDType.parse(dtype, "dtype")
    overrides = {k: TableDType.parse(v, f"table_dtypes[{k!r}]") for k, v in (table_dtypes or {}).items()}
    return {name: overrides.get(name, default) for name in names}


def check_parts(cfg: ModelConfig, tables: TableSource, dense: Mapping[str, Tensor], extra: list[str]) -> None:
    """ExportError unless ``tables`` has every table of ``cfg`` with its shape, ``dense`` every dense entry of
    ``cfg``'s prediction module with its shape, and nothing else (``extra``: the source's other keys)."""
    skeleton, ebc_path = build_skeleton(cfg)
    expected_dense = skeleton.state_dict()
    for table in cfg.tables:
        key = table_weight_key(ebc_path, table.name)
        shape = (table.num_embeddings, table.embedding_dim)
        got = tables.shape(key)
        if got is None:
            raise ExportError(f"state_dict has no {key!r} (table {table.name!r} of the model config)")
        if tuple(got) != shape:
            raise ExportError(f"state_dict[{key!r}]: shape {tuple(got)}, config says {shape}")
    for key in dense_state_keys(skeleton, ebc_path):
        if key not in dense:
            raise ExportError(f"state_dict has no {key!r}, which the model config's dense part needs")
        if dense[key].shape != expected_dense[key].shape:
            raise ExportError(
                f"state_dict[{key!r}]: shape {tuple(dense[key].shape)}, the model config gives "
                f"{tuple(expected_dense[key].shape)}"
            )
    known = set(dense_state_keys(skeleton, ebc_path)) | {
        table_weight_key(ebc_path, t.name) for t in cfg.tables
    }
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ExportError(f"state_dict has entries the model config does not know: {unknown[:5]}")


def split_state_dict(
    cfg: ModelConfig, state_dict: Mapping[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(table weights by table name, dense state)``, checked against ``cfg``'s prediction module."""
    _, ebc_path = build_skeleton(cfg)
    table_keys = {table_weight_key(ebc_path, t.name): t.name for t in cfg.tables}
    dense = {k: v for k, v in state_dict.items() if k not in table_keys}
    check_parts(cfg, StateDictSource(state_dict), dense, list(state_dict))
    return {name: state_dict[key] for key, name in table_keys.items()}, dense


def _own_dtypes(
    prequantized: Mapping[str, QuantizedTable], table_dtypes: Mapping[str, str] | None
) -> dict[str, TableDType]:
    """The dtypes of already quantized tables; ExportError where ``table_dtypes`` asks for another one."""
    for name, table in prequantized.items():
        asked = (table_dtypes or {}).get(name)
        if asked is not None and TableDType.parse(asked, f"table_dtypes[{name!r}]") is not table.dtype:
            raise ExportError(
                f"table_dtypes[{name!r}] = {asked!r}, but the model's table is already quantized to "
                f"{table.dtype.value}; export the float model to store it as {asked}"
            )
    return {name: table.dtype for name, table in prequantized.items()}


def _stream_table(
    writer: PackageWriter,
    tables: TableSource,
    key: str,
    table: Any,
    dtype: TableDType,
    kept: Tensor,
    prequantized: QuantizedTable | None = None,
) -> Tensor:
    """Quantize ``table`` a slice of rows at a time into the package (or copy its ``prequantized`` rows);
    returns its fp32 rows ``kept`` (the dequantized ones, for a prequantized table)."""
    compact = torch.zeros(max(1, kept.numel()), table.embedding_dim)
    step = max(1, _SLICE_BYTES // (4 * table.embedding_dim))
    for start in range(0, table.num_embeddings, step):
        end = min(table.num_embeddings, start + step)
        if prequantized is None:
            weight = tables.rows(key, start, end).detach().to("cpu", torch.float32)
            quantized = quantize_table(weight, dtype)
        else:
            quantized = prequantized.rows(start, end)
            weight = dequantize_table(quantized)
        writer.write_rows(table.name, start, kernel_rows(quantized.weights, quantized.scale_bias))
        inside = ((kept >= start) & (kept < end)).nonzero().squeeze(1)
        compact[inside] = weight[kept[inside] - start]
    return compact


def _check_accuracy(report: dict[str, Any], max_auc_drop: float, force: bool, pruned: bool = False) -> None:
    drop = -report["package"]["auc_diff"]
    report["max_auc_drop"] = max_auc_drop
    bf16 = report.get("dense_bf16")
    if bf16 is not None:  # serving runs the dense part in bf16 only within the same gate
        bf16_drop = -bf16["auc_diff"]
        bf16["allowed"] = bool(math.isnan(bf16_drop) or bf16_drop <= max_auc_drop)
    if math.isnan(drop):
        # Every logit of the fp32 model is equal: no ranking to lose, so only the logit differences speak.
        logger.warning("AUC is undefined on the accuracy sample (constant fp32 logits); not gating on it")
        report["passed"] = True
        return
    report["passed"] = drop <= max_auc_drop
    if report["passed"]:
        return
    what = "pruned and quantized" if pruned else "quantized"
    message = (
        f"{what} model loses {drop:.5f} AUC against fp32 (fp32 {report['fp32_auc']:.5f}, quantized "
        f"{report['package']['auc']:.5f}), more than max_auc_drop {max_auc_drop}"
    )
    if not force:
        raise AccuracyError(
            f"{message}; export refused. Use a wider dtype (--dtype/--table-dtype)"
            + (", keep more rows (--prune)" if pruned else "")
            + " or --force"
        )
    report["forced"] = True
    logger.warning("%s; exporting anyway (force)", message)


def _dense_bounds(
    dense_range: Mapping[str, Any] | None, action: str, width: int, source: dict[str, Any] | None
) -> dict[str, Any] | None:
    if action not in (*ACTIONS, "off"):
        raise ExportError(f"dense_bounds: expected one of {[*ACTIONS, 'off']}, got {action!r}")
    if action == "off" or dense_range is None:
        return None
    lows, highs = dense_range.get("min"), dense_range.get("max")
    if not (isinstance(lows, list) and isinstance(highs, list) and len(lows) == len(highs) == width):
        logger.warning(
            "the recorded dense range does not fit %d dense features; the package has no bound", width
        )
        return None
    step = (source or {}).get("step")
    origin = "training data range" + (f" recorded at step {step}" if step is not None else "")
    widened = f"widened by {WIDEN:g}x each column's span, largest magnitude or 1"
    return bounds_from_range(dense_range, action, f"{origin}, {widened}")


def export_package(
    out_dir: str | Path,
    *,
    model_config: ModelConfig,
    state_dict: Mapping[str, Tensor] | None = None,
    model: nn.Module | None = None,
    dtype: str = "int8",
    table_dtypes: Mapping[str, str] | None = None,
    dense_dtype: str = "fp32",
    devices: Sequence[str] = ("cpu",),
    model_name: str = "model",
    version: str = "1",
    source: dict[str, Any] | None = None,
    accuracy_sample: AccuracySample | None = None,
    max_auc_drop: float = DEFAULT_MAX_AUC_DROP,
    force: bool = False,
    capacity_bytes: Mapping[str, float] | None = None,
    overwrite: bool = False,
    dense_range: Mapping[str, Any] | None = None,
    dense_bounds: str = "refuse",
    prune: PrunePolicy | None = None,
    row_counts: Mapping[str, Tensor] | None = None,
) -> Path:
    """Write a model package of the prediction module ``state_dict`` (full tensors, prediction-module names).

    Args:
        state_dict / model: the weights: our prediction module's state dict, or (exactly one of the two) a
            module in memory whose state dict maps onto ``model_config``'s model: a TorchRec ``DLRM``,
            ``DLRM_DCN``, ``DLRMTrain``, two-tower, or one of ours (see ``torchrec_import``).
        dtype / table_dtypes: storage of every table / of named tables (int8, int4, int2, fp16, fp32).
        dense_dtype: fp32, bf16 or fp16 for the dense part.
        devices: serving devices for the placement (``cpu``; ``cuda:0,cuda:1``; logical ``cpu:0,cpu:1``).
        source: where the weights came from (checkpoint dir, step), recorded in the manifest.
        accuracy_sample: held-out examples for the accuracy report (default: synthetic, from the config).
        max_auc_drop, force: refuse (AccuracyError) when the AUC drop exceeds this, unless ``force``.
        capacity_bytes: memory per device for the placement (default: 90% of a GPU, unbounded on CPU).
        dense_range, dense_bounds: the training data's dense range (a checkpoint's ``extra["dense_range"]``)
            and what serving does beyond it, widened: ``refuse``, ``clip`` or ``off`` (no bound). Without a
            range the package has no bound.
        prune: drop rows by this policy (``recserve.export.prune``); the gate measures pruned+quantized.
        row_counts: each table's lookup counts per row (int32 ``[rows]``, by table name), for the count
            policies (a checkpoint carries its own; ``export_checkpoint`` reads them).
    """
    if (state_dict is None) == (model is None):
        raise ExportError("export_package: give exactly one of state_dict= and model=")
    prequantized: dict[str, QuantizedTable] = {}
    if model is not None:
        prequantized = {n: t for tables in quantized_tables_of(model).values() for n, t in tables.items()}
        model_config, state_dict = import_module(model_config, model)
    _, ebc_path = build_skeleton(model_config)
    table_keys = {table_weight_key(ebc_path, t.name) for t in model_config.tables}
    dense = {k: v for k, v in state_dict.items() if k not in table_keys}
    check_parts(model_config, StateDictSource(state_dict), dense, list(state_dict))
    options = dict(
        dtype=dtype,
        table_dtypes=table_dtypes,
        dense_dtype=dense_dtype,
        devices=devices,
        model_name=model_name,
        version=version,
        source=source,
        accuracy_sample=accuracy_sample,
        max_auc_drop=max_auc_drop,
        force=force,
        capacity_bytes=capacity_bytes,
        overwrite=overwrite,
        dense_range=dense_range,
        dense_bounds=dense_bounds,
        prune=prune,
    )
    counts = {table_weight_key(ebc_path, name): c for name, c in (row_counts or {}).items()}
    source = StateDictSource(state_dict, counts)
    return export_tables(out_dir, model_config, source, dense, prequantized=prequantized, **options)


def export_checkpoint(
    out_dir: str | Path, model_config: ModelConfig, checkpoint: CheckpointSource, **options: Any
) -> Path:
    """Export a training checkpoint, table by table (``options`` as for :func:`export_package`)."""
    check_parts(model_config, checkpoint, checkpoint.dense, [*checkpoint.keys(), *checkpoint.dense])
    return export_tables(out_dir, model_config, checkpoint, checkpoint.dense, **options)


def export_tables(
    out_dir: str | Path,
    cfg: ModelConfig,
    tables: TableSource,
    dense: Mapping[str, Tensor],
    *,
    dtype: str = "int8",
    table_dtypes: Mapping[str, str] | None = None,
    dense_dtype: str = "fp32",
    devices: Sequence[str] = ("cpu",),
    model_name: str = "model",
    version: str = "1",
    source: dict[str, Any] | None = None,
    accuracy_sample: AccuracySample | None = None,
    max_auc_drop: float = DEFAULT_MAX_AUC_DROP,
    force: bool = False,
    capacity_bytes: Mapping[str, float] | None = None,
    overwrite: bool = False,
    dense_range: Mapping[str, Any] | None = None,
    dense_bounds: str = "refuse",
    prequantized: Mapping[str, QuantizedTable] | None = None,
    prune: PrunePolicy | None = None,
) -> Path:
    """The package of checked parts: each table is read, quantized and written a slice of rows at a time
    (memory: one slice, plus the rows the accuracy sample reads), the accuracy gate runs on those rows.
    ``prequantized`` tables (a quantized model's) are written as they are, in their own dtype."""
    if dense_dtype not in DENSE_DTYPES:
        raise ExportError(f"dense_dtype: expected one of {list(DENSE_DTYPES)}, got {dense_dtype!r}")
    bounds = _dense_bounds(dense_range, dense_bounds, cfg.dense_in_features, source)
    prequantized = prequantized or {}
    dtypes = {**resolve_table_dtypes(cfg, dtype, table_dtypes), **_own_dtypes(prequantized, table_dtypes)}
    for t in cfg.tables:
        check_dim(t.name, t.embedding_dim, dtypes[t.name])
    loads = [
        TableLoad(t.name, t.num_embeddings, row_bytes(t.embedding_dim, dtypes[t.name]), float(t.num_features))
        for t in cfg.tables
    ]
    placement = plan_placement(loads, devices, capacity_bytes=capacity_bytes)
    dense_state = {k: v.detach().to("cpu", DENSE_DTYPES[dense_dtype]) for k, v in dense.items()}
    _, ebc_path = build_skeleton(cfg)
    keys = {t.name: table_weight_key(ebc_path, t.name) for t in cfg.tables}
    pruned = _pruned_tables(prune, cfg, tables, keys, prequantized)
    if accuracy_sample is None and prune is not None and prune.needs_counts:
        accuracy_sample = traffic_sample(cfg, {n: tables.counts(keys[n]) for n in pruned})
    compact = compact_sample(cfg, accuracy_sample or synthetic_sample(cfg))
    stored = {s: pruned[s.table].stored_rows(s) for s in placement.shards if s.table in pruned}
    writer = PackageWriter(
        out_dir,
        placement,
        {t.name: (t.embedding_dim, dtypes[t.name]) for t in cfg.tables},
        overwrite=overwrite,
        pruned=stored,
    )
    try:
        kept, served = {}, {}
        for t in cfg.tables:
            if t.name in pruned:
                kept[t.name], served[t.name] = stream_pruned_table(
                    writer, tables, keys[t.name], t, dtypes[t.name], placement.shards_of(t.name),
                    pruned[t.name], compact.rows[t.name],
                )  # fmt: skip
                continue
            kept[t.name] = served[t.name] = _stream_table(
                writer,
                tables,
                keys[t.name],
                t,
                dtypes[t.name],
                compact.rows[t.name],
                prequantized.get(t.name),
            )
        report = _compact_report(compact, kept, served, dtypes, dense, dense_state, dense_dtype, ebc_path)
        _check_accuracy(report, max_auc_drop, force, bool(pruned))
    except BaseException:
        writer.abort()
        raise
    metadata = metadata_for(cfg, {})
    manifest = PackageManifest(
        model_name=model_name,
        version=str(version),
        model_config=cfg.to_dict(),
        feature_names=metadata.feature_names,
        weighted_features=metadata.weighted_features,
        dense_in_features=cfg.dense_in_features,
        dense_dtype=dense_dtype,
        tables=[
            TableEntry(
                t.name,
                t.num_embeddings,
                t.embedding_dim,
                dtypes[t.name],
                _stored_bytes(t.name, loads[i], stored),
            )
            for i, t in enumerate(cfg.tables)
        ],
        placement=placement,
        source={**(source or {}), "recserve_version": recserve.__version__},
        accuracy=report,
        dense_bounds=bounds,
    )
    if pruned:
        manifest.pruning = pruning_record(prune, pruned, stored, report)
        manifest.format_version = PRUNED_FORMAT_VERSION
    path = writer.finish(manifest, dense_state)
    logger.info(
        "exported %s: %d tables over %s, AUC diff %.5f",
        path,
        len(cfg.tables),
        placement.devices,
        report["package"]["auc_diff"],
    )
    return path


def _pruned_tables(
    prune: PrunePolicy | None,
    cfg: ModelConfig,
    tables: TableSource,
    keys: Mapping[str, str],
    prequantized: Mapping[str, QuantizedTable],
) -> dict[str, PrunedTable]:
    if prune is None:
        return {}
    if prequantized:
        raise ExportError(
            f"--prune {prune}: the model's tables {sorted(prequantized)} are already quantized; export the "
            "float model to prune it"
        )
    return plan_pruning(prune, cfg, tables, keys)


def _stored_bytes(name: str, load: TableLoad, stored: Mapping[Any, int]) -> int:
    """A table's bytes in the package: all its rows, or the rows its pruned shards store."""
    rows = [n for shard, n in stored.items() if shard.table == name]
    return sum(rows) * load.row_bytes if rows else load.nbytes


def _compact_report(
    compact: CompactSample,
    kept: Mapping[str, Tensor],
    served: Mapping[str, Tensor],
    dtypes: Mapping[str, TableDType],
    dense: Mapping[str, Tensor],
    dense_state: Mapping[str, Tensor],
    dense_dtype: str,
    ebc_path: str,
) -> dict[str, Any]:
    """The accuracy report on the rows the sample reads (the compact model; see ``sample_rows``): the fp32
    model reads the trained rows ``kept``, the package the rows it serves for them (``served``: pruned rows
    replaced by their table's default, then quantized), ``by_dtype``'s uniform dtypes the trained rows."""
    cfg = compact.config
    quantized = {name: quantize_table(weight, dtypes[name]) for name, weight in served.items()}
    state = {**dense, **{table_weight_key(ebc_path, name): w for name, w in kept.items()}}
    loads = [TableLoad(t.name, t.num_embeddings, 1) for t in cfg.tables]
    placement = plan_placement(loads, ["cpu"])
    return accuracy_report(
        cfg, state, kept, quantized, placement, dense_state, dense_dtype, sample=compact.sample
    )
