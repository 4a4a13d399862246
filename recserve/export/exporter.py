"""``export_package``: a trained prediction module's state dict -> a quantized, placed, checked model package.

Order of work: check the state dict against the architecture config; quantize each table; plan the serving
placement; cast the dense part; measure accuracy against fp32 (refuse above the threshold unless forced);
write the package atomically.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

import recserve
from recserve.errors import AccuracyError, ExportError
from recserve.export.accuracy import AccuracySample, accuracy_report
from recserve.export.planner import TableLoad, plan_placement
from recserve.export.quantize import check_dim, quantize_table
from recserve.export.torchrec_import import import_module
from recserve.export.writer import write_package
from recserve.runtime.assembly import build_skeleton, dense_state_keys, table_weight_key
from recserve.runtime.dense_bounds import ACTIONS, WIDEN, bounds_from_range
from recserve.runtime.layout import QuantizedTable, TableDType, row_bytes
from recserve.runtime.package import PackageManifest, TableEntry
from recserve.runtime.predictor import DENSE_DTYPES, metadata_for
from recserve.runtime.quant_embedding import split_by_placement
from rectrain.models.config import ModelConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_AUC_DROP = 0.005


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


def split_state_dict(
    cfg: ModelConfig, state_dict: Mapping[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(table weights by table name, dense state)``, checked against ``cfg``'s prediction module."""
    skeleton, ebc_path = build_skeleton(cfg)
    expected_dense = skeleton.state_dict()
    tables: dict[str, Tensor] = {}
    for table in cfg.tables:
        key = table_weight_key(ebc_path, table.name)
        shape = (table.num_embeddings, table.embedding_dim)
        if key not in state_dict:
            raise ExportError(f"state_dict has no {key!r} (table {table.name!r} of the model config)")
        if tuple(state_dict[key].shape) != shape:
            raise ExportError(
                f"state_dict[{key!r}]: shape {tuple(state_dict[key].shape)}, config says {shape}"
            )
        tables[table.name] = state_dict[key]
    dense: dict[str, Tensor] = {}
    for key in dense_state_keys(skeleton, ebc_path):
        if key not in state_dict:
            raise ExportError(f"state_dict has no {key!r}, which the model config's dense part needs")
        if state_dict[key].shape != expected_dense[key].shape:
            raise ExportError(
                f"state_dict[{key!r}]: shape {tuple(state_dict[key].shape)}, the model config gives "
                f"{tuple(expected_dense[key].shape)}"
            )
        dense[key] = state_dict[key]
    extra = sorted(set(state_dict) - set(dense) - {table_weight_key(ebc_path, t) for t in tables})
    if extra:
        raise ExportError(f"state_dict has entries the model config does not know: {extra[:5]}")
    return tables, dense


def _quantize_all(
    cfg: ModelConfig, tables: Mapping[str, Tensor], dtypes: Mapping[str, TableDType]
) -> dict[str, QuantizedTable]:
    quantized = {}
    for table in cfg.tables:
        check_dim(table.name, table.embedding_dim, dtypes[table.name])
        quantized[table.name] = quantize_table(tables[table.name], dtypes[table.name])
    return quantized


def _check_accuracy(report: dict[str, Any], max_auc_drop: float, force: bool) -> None:
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
    message = (
        f"quantized model loses {drop:.5f} AUC against fp32 (fp32 {report['fp32_auc']:.5f}, quantized "
        f"{report['package']['auc']:.5f}), more than max_auc_drop {max_auc_drop}"
    )
    if not force:
        raise AccuracyError(
            f"{message}; export refused. Use a wider dtype (--dtype/--table-dtype) or --force"
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
    """
    if dense_dtype not in DENSE_DTYPES:
        raise ExportError(f"dense_dtype: expected one of {list(DENSE_DTYPES)}, got {dense_dtype!r}")
    if (state_dict is None) == (model is None):
        raise ExportError("export_package: give exactly one of state_dict= and model=")
    if model is not None:
        model_config, state_dict = import_module(model_config, model)
    dtypes = resolve_table_dtypes(model_config, dtype, table_dtypes)
    tables, dense = split_state_dict(model_config, state_dict)
    quantized = _quantize_all(model_config, tables, dtypes)
    loads = [
        TableLoad(t.name, t.num_embeddings, row_bytes(t.embedding_dim, dtypes[t.name]), float(t.num_features))
        for t in model_config.tables
    ]
    placement = plan_placement(loads, devices, capacity_bytes=capacity_bytes)
    dense_state = {k: v.detach().to("cpu", DENSE_DTYPES[dense_dtype]) for k, v in dense.items()}
    report = accuracy_report(
        model_config,
        state_dict,
        tables,
        quantized,
        placement,
        dense_state,
        dense_dtype,
        sample=accuracy_sample,
    )
    _check_accuracy(report, max_auc_drop, force)
    metadata = metadata_for(model_config, {})
    manifest = PackageManifest(
        model_name=model_name,
        version=str(version),
        model_config=model_config.to_dict(),
        feature_names=metadata.feature_names,
        weighted_features=metadata.weighted_features,
        dense_in_features=model_config.dense_in_features,
        dense_dtype=dense_dtype,
        tables=[
            TableEntry(t.name, t.num_embeddings, t.embedding_dim, dtypes[t.name], quantized[t.name].nbytes)
            for t in model_config.tables
        ],
        placement=placement,
        source={**(source or {}), "recserve_version": recserve.__version__},
        accuracy=report,
        dense_bounds=_dense_bounds(dense_range, dense_bounds, model_config.dense_in_features, source),
    )
    path = write_package(
        out_dir, manifest, split_by_placement(quantized, placement), dense_state, overwrite=overwrite
    )
    logger.info(
        "exported %s: %d tables over %s, AUC diff %.5f",
        path,
        len(tables),
        placement.devices,
        report["package"]["auc_diff"],
    )
    return path
