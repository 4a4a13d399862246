"""``recserve main``'s flags (``python -m recserve.mainjob``, which ``./run.sh`` runs, is that command)."""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import fields
from pathlib import Path

from recserve.mainjob.config import DEVICES, ONLINE_DEFAULTS, MainJobConfig, main_job_config

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
    "files": "--online: arriving files",
    "rows_per_file": "--online: rows of each file",
    "change_at_file": "--online: first file (0-based) where the planted ids click more",
    "file_interval_s": "--online: seconds between two files",
    "publish_every_s": "--online: seconds between deltas (publish.every_seconds)",
    "base_every": "--online: deltas between bases (publish.base_every)",
    "planted_boost": "--online: logit added to the clicks of rows holding a planted id",
    "probe_rows": "--online: examples of each kind (planted ids, controls) the probe scores",
    "probe_interval_s": "--online: seconds between probes",
    "min_rise": "--online: the job fails unless planted-minus-control scores rise by this much",
}


def add_main_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``main``: one flag per ``MainJobConfig`` field, defaults from the dataclass (with
    ``--online``: ``ONLINE_DEFAULTS`` over it)."""
    parser = subparsers.add_parser(
        "main",
        help="the whole path: data, 2-rank training, export, serve, query, load test, summary; --online: "
        "arriving data, online training publishing to a following server, freshness",
    )
    add_arguments(parser)
    parser.set_defaults(func=run_command)


_SIZES = [f for f in fields(MainJobConfig) if f.name != "online"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--online",
        action="store_true",
        help="the online mode: files arrive with a planted change, 2-rank training follows them and "
        "publishes, a server follows the publish dir under load, a probe shows the change being served",
    )
    for f in _SIZES:
        default = f.default
        online = ONLINE_DEFAULTS.get(f.name)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=Path if f.name == "out" else type(default),
            default=None,  # None: the mode's default (``main_job_config``)
            choices=DEVICES if f.name == "device" else None,
            help=f"{_HELP[f.name]} (default {default}" + (f"; --online: {online})" if online else ")"),
        )


def config_from_args(args: argparse.Namespace) -> MainJobConfig:
    """The flags given, over the defaults of the mode (``--online`` or not)."""
    given = {f.name: getattr(args, f.name) for f in _SIZES if getattr(args, f.name) is not None}
    return main_job_config(args.online, **given)


def run_command(args: argparse.Namespace) -> int:
    """Run the main job from parsed flags; SIGTERM is turned into Ctrl-C so the server is still stopped."""
    from recserve.mainjob.modes import run_main_job

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cfg = config_from_args(args)
    try:
        run_main_job(cfg, echo=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print("recserve main: interrupted; the server (if started) was stopped", file=sys.stderr)
        return 130
    return 0
