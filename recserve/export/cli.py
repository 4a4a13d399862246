"""``recserve export``: a training checkpoint (any world size) -> a model package."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from recserve.errors import ExportError
from recserve.export.exporter import DEFAULT_MAX_AUC_DROP, export_package
from recserve.export.triton_repository import TritonOptions, write_triton_repository
from recserve.runtime.layout import TableDType
from recserve.runtime.package import read_manifest
from recserve.runtime.predictor import DENSE_DTYPES

logger = logging.getLogger(__name__)


def add_export_command(subparsers: Any) -> None:
    """Register ``export`` on the ``recserve`` parser's subcommands."""
    dtypes = [d.value for d in TableDType]
    parser = subparsers.add_parser(
        "export",
        help="quantize a training checkpoint into a model package",
        description="Read a checkpoint of any world size, quantize its tables row-wise, place them on the "
        "serving devices, check accuracy against fp32 and write a model package.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="checkpoint root (or one step_<N> directory)")
    source.add_argument(
        "--from-torchrec",
        metavar="DIR|FILE.safetensors",
        help="a model trained with TorchRec: a torch.distributed.checkpoint directory (e.g. saved from "
        "DistributedModelParallel, any world size) or a .safetensors file of its state_dict() (pickled "
        "torch.save files are never read)",
    )
    source.add_argument(
        "--package",
        metavar="DIR",
        help="an exported package: write only its --triton-repository (no export)",
    )
    parser.add_argument(
        "--model-config",
        metavar="MODEL.toml|json",
        help="with --from-torchrec: the architecture, as our ModelConfig ([model] table or the table itself)",
    )
    parser.add_argument("--out", help="package directory to create (required unless --package)")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    parser.add_argument("--dtype", default="int8", choices=dtypes, help="storage of every table")
    parser.add_argument(
        "--table-dtype",
        action="append",
        default=[],
        metavar="TABLE=DTYPE",
        help="storage of one table, e.g. t3=int4 (repeatable)",
    )
    parser.add_argument("--dense-dtype", default="fp32", choices=list(DENSE_DTYPES))
    parser.add_argument(
        "--devices", default="cpu", help="serving devices, comma-separated: cpu | cuda:0,cuda:1 | cpu:0,cpu:1"
    )
    parser.add_argument(
        "--model-name",
        help="served model name (default: the checkpoint's run name, i.e. its extra['run_name'] or the name "
        "of the checkpoint directory that holds the step_<N> directories)",
    )
    parser.add_argument("--version", default="1")
    parser.add_argument(
        "--max-auc-drop",
        type=float,
        default=DEFAULT_MAX_AUC_DROP,
        help="refuse when quantization costs more AUC than this (default %(default)s)",
    )
    parser.add_argument("--force", action="store_true", help="export even above --max-auc-drop")
    parser.add_argument(
        "--prune",
        metavar="POLICY",
        help="ship only some rows of each table: count:N (rows training looked up >= N times), top:F (the "
        "fraction F looked up most), norm:F (the fraction F of largest L2 norm; needs no row counts); the "
        "accuracy gate measures the pruned package (docs/export.md)",
    )
    parser.add_argument(
        "--prune-default",
        choices=["zero", "mean"],
        default="zero",
        help="what a pruned id serves: a zero vector, or the mean of its table's pruned rows (default zero)",
    )
    parser.add_argument(
        "--dense-bounds",
        choices=["refuse", "clip", "off"],
        default="refuse",
        help="dense inputs far beyond the training data's range (recorded by rectrain train, widened by 10x "
        "each column's scale) are refused by the server (default), clipped, or not bounded",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing package at --out")
    triton = parser.add_argument_group("Triton model repository (Python backend hosting the package)")
    triton.add_argument(
        "--triton-repository",
        metavar="DIR",
        help="also write DIR/<model>/{config.pbtxt,<version>/} so that tritonserver serves the package",
    )
    defaults = TritonOptions()
    triton.add_argument(
        "--triton-instances", type=int, default=defaults.instances, help="model instances (one per core)"
    )
    triton.add_argument(
        "--triton-max-requests",
        type=int,
        default=defaults.max_requests_per_batch,
        help="requests per batch of Triton's dynamic batcher (default %(default)s)",
    )
    triton.add_argument(
        "--triton-max-queue-delay-us",
        type=int,
        default=defaults.max_queue_delay_us,
        help="Triton's max_queue_delay_microseconds (default %(default)s)",
    )
    parser.set_defaults(func=run_export)


def parse_table_dtypes(items: list[str]) -> dict[str, str]:
    """``["t3=int4", ...]`` -> ``{"t3": "int4"}``; ExportError naming the malformed item."""
    result = {}
    for item in items:
        name, sep, dtype = item.partition("=")
        if not sep or not name or not dtype:
            raise ExportError(f"--table-dtype {item!r}: expected TABLE=DTYPE, e.g. t3=int4")
        result[name.strip()] = dtype.strip()
    return result


def default_model_name(checkpoint: str | Path, extra: dict[str, Any]) -> str:
    """The run a checkpoint belongs to: ``extra["run_name"]`` when training recorded one, else the name of the
    checkpoint root (``ckpt/dlrm`` or ``ckpt/dlrm/step_100`` -> ``dlrm``), so that a re-export of the same
    run keeps the name clients address."""
    from rectrain.checkpoint.manifest import STEP_PREFIX

    recorded = extra.get("run_name")
    if isinstance(recorded, str) and recorded.strip():
        return recorded.strip()
    root = Path(checkpoint).resolve()
    if root.name.startswith(STEP_PREFIX):
        root = root.parent
    return root.name or "model"


def prune_policy(args: argparse.Namespace) -> Any:
    """``--prune`` parsed (None without it); ExportError in one line on a bad value."""
    from recserve.export.prune import PrunePolicy

    if args.prune is None:
        return None
    return PrunePolicy.parse(args.prune, args.prune_default)


def run_export(args: argparse.Namespace) -> int:
    prune_policy(args)  # a bad --prune is refused before anything is read
    if args.package is None and args.out is None:
        raise ExportError("--out: required (the package directory to create)")
    if args.package is not None:
        if args.triton_repository is None:
            raise ExportError("--package: only writes a --triton-repository; give one")
        return _write_triton(Path(args.package), args)
    code = run_torchrec_export(args) if args.from_torchrec is not None else _run_checkpoint_export(args)
    if args.triton_repository is not None:
        _write_triton(Path(args.out), args)
    return code


def _write_triton(package: Path, args: argparse.Namespace) -> int:
    options = TritonOptions(
        max_requests_per_batch=args.triton_max_requests,
        max_queue_delay_us=args.triton_max_queue_delay_us,
        instances=args.triton_instances,
    )
    model_dir = write_triton_repository(package, args.triton_repository, options)
    print(f"wrote Triton model {model_dir} (Python backend; recserve and torch must be on its PYTHONPATH)")
    return 0


def _run_checkpoint_export(args: argparse.Namespace) -> int:
    if args.model_config is not None:
        raise ExportError("--model-config applies to --from-torchrec; a checkpoint records its model config")
    from recserve.export.sources import CheckpointSource
    from rectrain.errors import ConfigError
    from rectrain.models.config import ModelConfig

    with CheckpointSource(args.checkpoint, step=args.step) as checkpoint:
        manifest = checkpoint.manifest
        if manifest.model_config is None:
            raise ExportError(
                f"{args.checkpoint}: the checkpoint records no model_config; save it with "
                "save_checkpoint(..., model_config=cfg) so that export knows the architecture"
            )
        try:
            cfg = ModelConfig.from_dict(manifest.model_config, where=f"{args.checkpoint}: model_config")
        except ConfigError as error:
            raise ExportError(str(error)) from None
        source = {"checkpoint": str(Path(args.checkpoint).resolve()), "step": manifest.step}
        source["world_size"] = manifest.world_size
        path = _export_checkpoint(args, cfg, checkpoint, source)
    _print_summary(path)
    return 0


def _export_checkpoint(args: argparse.Namespace, cfg: Any, checkpoint: Any, source: dict) -> Path:
    """``export_checkpoint`` with the command line's options (table by table: memory of one slice)."""
    from recserve.export.exporter import export_checkpoint

    return export_checkpoint(
        args.out,
        cfg,
        checkpoint,
        dtype=args.dtype,
        table_dtypes=parse_table_dtypes(args.table_dtype),
        dense_dtype=args.dense_dtype,
        devices=[d for d in args.devices.split(",") if d.strip()],
        model_name=args.model_name or default_model_name(args.checkpoint, checkpoint.manifest.extra),
        version=args.version,
        source=source,
        max_auc_drop=args.max_auc_drop,
        force=args.force,
        overwrite=args.overwrite,
        dense_range=checkpoint.manifest.extra.get("dense_range"),
        dense_bounds=args.dense_bounds,
        prune=prune_policy(args),
    )


def run_torchrec_export(args: argparse.Namespace) -> int:
    """``--from-torchrec``: the model config from ``--model-config``, the weights from TorchRec's files."""
    from recserve.export.torchrec_import import load_torchrec, read_model_config

    if args.model_config is None:
        raise ExportError(
            "--from-torchrec needs --model-config MODEL.toml|json (TorchRec files hold no config)"
        )
    if args.step is not None:
        raise ExportError("--step applies to --checkpoint; a TorchRec checkpoint directory is one step")
    cfg, state, source = load_torchrec(args.from_torchrec, read_model_config(args.model_config))
    path = export_package(
        args.out,
        model_config=cfg,
        state_dict=state,
        dtype=args.dtype,
        table_dtypes=parse_table_dtypes(args.table_dtype),
        dense_dtype=args.dense_dtype,
        devices=[d for d in args.devices.split(",") if d.strip()],
        model_name=args.model_name,
        version=args.version,
        source=source,
        max_auc_drop=args.max_auc_drop,
        force=args.force,
        overwrite=args.overwrite,
        prune=prune_policy(args),
    )
    _print_summary(path)
    return 0


def _print_summary(path: Path) -> None:
    package = read_manifest(path)
    total = sum(entry["bytes"] for entry in package.files.values())
    source = package.source or {}
    where = f"step {source.get('step')} of {source.get('checkpoint')}"
    if "torchrec" in source:
        where = f"TorchRec {source.get('format')} {source['torchrec']}"
    print(f"wrote {path} ({total / 2**20:.1f} MiB) from {where}")
    for table in package.tables:
        placed = package.placement.shards_of(table.name)
        shards = ", ".join(f"{s.device}[{s.row_start}:{s.row_end}]" for s in placed)
        print(f"  {table.name}: {table.dtype.value}, {table.nbytes / 2**20:.2f} MiB on {shards}")
    report = package.accuracy or {}
    print(f"accuracy vs fp32 on {report['sample']['examples']} examples (fp32 AUC {report['fp32_auc']:.4f}):")
    print(f"  {'tables':<8} {'max|dlogit|':>12} {'mean|dlogit|':>13} {'AUC diff':>10}")
    rows = {"package": report["package"], **report["by_dtype"]}
    for name, row in rows.items():
        print(
            f"  {name:<8} {row['max_abs_logit_diff']:>12.2e} {row['mean_abs_logit_diff']:>13.2e} "
            f"{row['auc_diff']:>+10.5f}"
        )
    if package.pruning:
        kept = package.pruning["tables"]
        shown = ", ".join(f"{name} {t['kept']:,}/{t['rows']:,}" for name, t in kept.items())
        policy, default = package.pruning["policy"], package.pruning["default"]
        print(f"pruned by {policy} (pruned ids serve {default}): rows kept {shown}")
        print(f"  AUC drop of the pruned package {package.pruning['auc_drop']:.5f}")
    if report.get("forced"):
        print(f"WARNING: AUC drop above --max-auc-drop {report['max_auc_drop']}; exported because of --force")
