"""``recserve main``'s flags (``python -m recserve.mainjob``, which ``./run.sh`` runs, is that command)."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import fields
from pathlib import Path

from recserve.mainjob.config import DEVICES, MainJobConfig

_HELP = {
    "out": "output directory for every artefact",
    "rows": "synthetic training rows",
    "heldout_rows": "synthetic held-out rows (a separate file)",
    "vocab_size": "distinct tokens per categorical column",
    "num_embeddings": "rows of each of the 26 embedding tables",
    "embedding_dim": "embedding width",
    "steps": "training steps",
    "batch_size": "examples per step and rank",
    "eval_batches": "held-out batches per rank in the final evaluation",
    "nproc": "local training ranks (torchrun --nproc-per-node)",
    "query_rows": "held-out rows sent to the server and compared with the in-process Predictor",
    "loadgen_seconds": "measured seconds of the load test",
    "loadgen_concurrency": "load-test callers in flight",
    "loadgen_batch": "examples per load-test request",
    "server_start_timeout_s": "seconds to wait for the server to report SERVING",
    "seed": "seed of the data and the training run",
    "device": "cuda: train on the GPUs (one per rank), export onto cuda:0 and serve there; cpu: all on the "
    "CPU; auto: train where train.device = auto picks, export and serve on the CPU",
}


def add_main_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``main``: one flag per ``MainJobConfig`` field, defaults from the dataclass."""
    parser = subparsers.add_parser(
        "main", help="the whole path: data, 2-rank training, export, serve, query, load test, summary"
    )
    add_arguments(parser)
    parser.set_defaults(func=run_command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(MainJobConfig):
        default = f.default
        kind = Path if f.name == "out" else type(default)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=kind,
            default=default,
            choices=DEVICES if f.name == "device" else None,
            help=f"{_HELP[f.name]} (default %(default)s)",
        )


def run_command(args: argparse.Namespace) -> int:
    """Run the main job from parsed flags; SIGTERM is turned into Ctrl-C so the server is still stopped."""
    from recserve.mainjob.job import run_main_job

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cfg = MainJobConfig(**{f.name: getattr(args, f.name) for f in fields(MainJobConfig)})
    try:
        run_main_job(cfg, echo=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("recserve main: interrupted; the server (if started) was stopped", file=sys.stderr)
        return 130
    return 0
