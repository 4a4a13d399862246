"""The `rectrain` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from rectrain.errors import RecTrainError

if TYPE_CHECKING:
    from rectrain.demo import DemoConfig
    from rectrain.distributed import ShardingEnv


def _launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def _demo(args: argparse.Namespace) -> int:
    from rectrain.demo import DemoConfig

    cfg = DemoConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed)
    if not _launched_by_torchrun():
        return _run_demo(cfg, None)
    from rectrain.distributed.comm.env import torchrun_session

    with torchrun_session() as env:
        return _run_demo(cfg, env)


def _run_demo(cfg: DemoConfig, env: ShardingEnv | None) -> int:
    from rectrain.demo import run_demo

    reporting = env is None or env.rank == 0
    where = "" if env is None else f", sharded over {env.world_size} ranks ({cfg.batch_size} per rank)"
    if reporting:
        print(
            f"rectrain demo: {cfg.num_tables} tables x {cfg.num_embeddings:,} rows "
            f"x {cfg.embedding_dim} dims (FBGEMM lookups, row-wise Adagrad fused into backward), "
            f"{cfg.steps} steps of batch {cfg.batch_size} on synthetic click data{where}"
        )
    s = run_demo(cfg, env)
    if reporting:
        if s.plan_report:
            print(s.plan_report)
        print(
            f"trained {s.steps} steps / {s.examples:,} examples in {s.seconds:.1f} s "
            f"({s.examples / s.seconds:,.0f} examples/s)"
        )
        print(f"log loss: first {s.steps // 10 or 1} steps {s.first_loss:.4f} -> last {s.last_loss:.4f}")
        print(f"held-out accuracy: {s.accuracy:.3f} (0.5 is chance)")
    return 0


def _train(args: argparse.Namespace) -> int:
    from rectrain.train.commands import train_command

    return train_command(args, _launched_by_torchrun())


def _plan(args: argparse.Namespace) -> int:
    from rectrain.train.commands import plan_command

    world_size = args.world_size or int(os.environ.get("WORLD_SIZE", "1"))
    return plan_command(args, world_size)


def _eval(args: argparse.Namespace) -> int:
    from rectrain.train.commands import eval_command

    return eval_command(args, _launched_by_torchrun())


def _bench(args: argparse.Namespace) -> int:
    from rectrain.train.commands import bench_command

    return bench_command(args, _launched_by_torchrun())


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text}")
    return value


def _config_command(sub: argparse._SubParsersAction, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand reading ``--config run.toml`` with ``--set section.key=value`` overrides."""
    command = sub.add_parser(name, help=help, description=help)
    command.add_argument("--config", required=True, metavar="RUN_TOML", help="the run config (TOML)")
    command.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.steps=50 (repeatable; values are TOML)",
    )
    return command


def _add_training_commands(sub: argparse._SubParsersAction) -> None:
    train = _config_command(sub, "train", "train the model of a run config (alone or under torchrun)")
    train.add_argument("--strict", action="store_true", help="stop at the first malformed data row")
    train.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh: delete the checkpoints already in checkpoint.dir (a torchrun restart resumes)",
    )
    train.set_defaults(func=_train)
    plan = _config_command(sub, "plan", "print the sharding plan of a run config without training")
    plan.add_argument(
        "--world-size", type=_positive_int, help="ranks to plan for (default: $WORLD_SIZE or 1)"
    )
    plan.add_argument("--out", metavar="PLAN_JSON", help="also write the plan as JSON (planner.plan_file)")
    plan.set_defaults(func=_plan)
    evaluate = _config_command(sub, "eval", "evaluate a checkpoint on the held-out split of a run config")
    evaluate.add_argument("--checkpoint", metavar="DIR", help="checkpoint dir (default: checkpoint.dir)")
    evaluate.add_argument("--step", type=int, help="the checkpoint step (default: the latest)")
    evaluate.set_defaults(func=_eval)
    bench = _config_command(sub, "bench", "time training steps of a run config and print examples/s")
    bench.add_argument("--steps", type=_positive_int, default=20, help="timed steps (default 20)")
    bench.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    bench.add_argument(
        "--data",
        metavar="FILE",
        help="also train from FILE through the real reader (TSV, .gz, converted dir, .parquet) and report "
        "its examples/s against synthetic batches, interleaved in one run",
    )
    bench.add_argument(
        "--rounds", type=_positive_int, default=3, help="with --data: timed rounds of each stream (default 3)"
    )
    bench.set_defaults(func=_bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rectrain", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small embedding model on synthetic data and report")
    demo.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    demo.add_argument("--batch-size", type=int, default=512, help="examples per step (default 512)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)
    _add_training_commands(sub)
    from rectrain.checkpoint.cli import add_ckpt_command
    from rectrain.datasets.cli import add_data_command

    add_ckpt_command(sub)
    add_data_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # force: importing fbgemm_gpu logs through the root logger, which configures it first. Our own logs at
    # INFO, other libraries' (FBGEMM's table dumps) at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", force=True)
    logging.getLogger("rectrain").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        code = args.func(args)
    except RecTrainError as e:
        print(f"rectrain: error: {e}", file=sys.stderr)
        code = 2
    if _launched_by_torchrun():
        from rectrain.distributed.comm.env import exit_without_finalizing

        exit_without_finalizing(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
