"""``rectrain ckpt info | verify | reshard``: inspect, check and re-shard checkpoints on the command line."""

from __future__ import annotations

import argparse
import datetime
import json

from rectrain.checkpoint.manifest import Manifest, read_manifest, resolve_step_dir


def _size(num_bytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1024 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")


def format_info(manifest: Manifest, where: str) -> str:
    """The ``ckpt info`` text: header, files, one row per table, dense state, ``extra``, data position."""
    when = datetime.datetime.fromtimestamp(manifest.created_unix).isoformat(timespec="seconds")
    lines = [
        f"checkpoint {where}: step {manifest.step}, saved by {manifest.world_size} rank(s) at {when} "
        f"(format {manifest.format_version})",
        "files: " + ", ".join(f"{name} {_size(e.bytes)}" for name, e in sorted(manifest.files.items())),
        f"{'table':<12} {'collection':<42} {'rows x dim':>14} {'dtype':<8} {'sharding':<14} {'shards':>6}  "
        "optimizer state",
    ]
    for table in sorted(manifest.tables.values(), key=lambda t: (t.collection, t.name)):
        rows, cols = table.global_shape
        states = ", ".join(f"{n} ({s.kind})" for n, s in sorted(table.optimizer_state.items())) or "-"
        if table.row_counts is not None:
            states += "; row counts"
        lines.append(
            f"{table.name:<12} {table.collection:<42} {f'{rows:,} x {cols}':>14} {table.weight.dtype:<8} "
            f"{table.sharding_type:<14} {len(table.weight.shards):>6}  {states}"
        )
    numel = sum(_numel(e.shape) for e in manifest.dense_params.values())
    optimizers = sorted(manifest.dense_optimizer or {}) or ["-"]
    lines.append(
        f"dense: {len(manifest.dense_params)} tensors, {numel:,} values; "
        f"dense optimizers: {', '.join(optimizers)}"
    )
    if manifest.model_config is not None:
        lines.append(f"model: {manifest.model_config.get('kind', '?')}")
    lines.append(f"extra: {json.dumps(manifest.extra, sort_keys=True)}")
    if manifest.data_position is not None:
        lines.append(f"data position: {json.dumps(manifest.data_position, sort_keys=True)}")
    return "\n".join(lines)


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _info(args: argparse.Namespace) -> int:
    from rectrain.checkpoint.verify import layout_problems

    step_dir = resolve_step_dir(args.dir, args.step)
    manifest = read_manifest(step_dir)
    print(format_info(manifest, str(step_dir)))
    problems = layout_problems(manifest)  # overlapping or missing shards: nothing could load it
    for problem in problems:
        print(f"LAYOUT PROBLEM {problem}")
    if problems:
        print(f"{step_dir}: {len(problems)} layout problem(s); resume, eval and export refuse it")
    return 1 if problems else 0


def _verify(args: argparse.Namespace) -> int:
    from rectrain.checkpoint.verify import verify_checkpoint

    report = verify_checkpoint(args.dir, args.step, checksums=not args.no_checksums)
    if report.ok:
        manifest = report.manifest
        print(
            f"OK {report.step_dir}: {len(manifest.files)} files, {len(manifest.tables)} tables "
            "fully covered, "
            f"checksums {'skipped' if args.no_checksums else 'match'}"
        )
        return 0
    for problem in report.problems:
        print(f"FAIL {problem}")
    print(f"{report.step_dir}: {len(report.problems)} problem(s)")
    return 1


def _reshard(args: argparse.Namespace) -> int:
    from rectrain.checkpoint.offline import reshard_checkpoint

    path = reshard_checkpoint(args.dir, world_size=args.world_size, out=args.out, step=args.step)
    manifest = read_manifest(path)
    kinds = sorted({t.sharding_type for t in manifest.tables.values()})
    print(f"wrote {path} for {args.world_size} rank(s) ({len(manifest.tables)} tables: {', '.join(kinds)})")
    return 0


def add_ckpt_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``ckpt`` with its ``info``, ``verify`` and ``reshard`` subcommands."""
    ckpt = subparsers.add_parser("ckpt", help="inspect, verify or re-shard a checkpoint")
    sub = ckpt.add_subparsers(dest="ckpt_command", required=True)
    for name, func, text in (
        ("info", _info, "summarise a checkpoint: step, files, tables and their sharding"),
        ("verify", _verify, "check files, checksums, shapes and that every table row is stored exactly once"),
        ("reshard", _reshard, "rewrite a checkpoint for another world size (offline, no process group)"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("dir", help="checkpoint root (with 'latest') or a step_<N> directory")
        command.add_argument("--step", type=int, default=None, help="the step to use (default: latest)")
        command.set_defaults(func=func)
        if name == "verify":
            command.add_argument(
                "--no-checksums", action="store_true", help="skip sha256 (sizes still checked)"
            )
        if name == "reshard":
            command.add_argument("--world-size", type=int, required=True, help="ranks to re-shard for")
            command.add_argument("--out", required=True, help="root directory of the re-sharded checkpoint")
