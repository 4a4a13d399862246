"""The ``recserve`` command line: ``export``, ``pipeline``, ``serve``, ``query`` / ``loadgen``, ``main``."""

from __future__ import annotations

import argparse
import logging
import sys

from recserve.client.cli import add_client_commands
from recserve.errors import RecServeError
from recserve.export.cli import add_export_command
from recserve.mainjob.cli import add_main_command
from recserve.recommend.cli import add_pipeline_command
from recserve.server.operations.cli import add_serve_commands
from recserve.server.operations.workers import one_line
from rectrain.errors import RecTrainError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recserve", description="Export and serve rectrain models.")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default %(default)s)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_export_command(subparsers)
    add_pipeline_command(subparsers)
    add_serve_commands(subparsers)
    add_client_commands(subparsers)
    add_main_command(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.func(args)
    except (RecServeError, RecTrainError) as error:
        print(f"recserve {args.command}: error: {one_line(str(error))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
