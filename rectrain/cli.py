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
    from rectrain.distributed.env import torchrun_session

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rectrain", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small embedding model on synthetic data and report")
    demo.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    demo.add_argument("--batch-size", type=int, default=512, help="examples per step (default 512)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s"
    )
    try:
        code = args.func(args)
    except RecTrainError as e:
        print(f"rectrain: error: {e}", file=sys.stderr)
        code = 2
    if _launched_by_torchrun():
        from rectrain.distributed.env import exit_without_finalizing

        exit_without_finalizing(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
