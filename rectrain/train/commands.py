"""The ``rectrain train | plan | eval | bench`` commands: read the config, run on this rank, print results.

Each runs alone (one process) or as one rank under ``torchrun`` (the process group is set up and torn down
around it); only rank 0 prints. Results go to stdout, progress and logs to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rectrain.distributed import ShardingEnv
from rectrain.errors import ConfigError
from rectrain.train.config import RunConfig

EXIT_STOPPED = 128 + signal.SIGTERM  # 143: stopped early by SIGTERM, checkpoint written
_METRIC_ORDER = ("auc", "ne", "log_loss", "accuracy", "calibration", "num_examples")


def load_config(args: argparse.Namespace) -> RunConfig:
    """The ``--config`` file with ``--set`` overrides (and ``--strict`` when the command has it)."""
    overrides = list(args.set or [])
    if getattr(args, "strict", False):
        overrides.append("data.strict=true")
    if getattr(args, "overwrite", False):
        overrides.append("checkpoint.overwrite=true")
    return RunConfig.load(args.config, overrides)


def run_on_ranks(
    fn: Callable[[ShardingEnv | None], int], distributed: bool, config: RunConfig | None = None
) -> int:
    """``fn(env)`` inside a torchrun session when ``distributed`` (collectives time out after the config's
    ``train.collective_timeout_s``), else ``fn(None)``."""
    if not distributed:
        return fn(None)
    from datetime import timedelta

    from rectrain.distributed.comm.env import torchrun_session

    timeout = timedelta(seconds=config.train.collective_timeout_s) if config is not None else None
    with torchrun_session(timeout=timeout) as env:
        return fn(env)


def _is_reporting(env: ShardingEnv | None) -> bool:
    return env is None or env.rank == 0


def format_metrics(metrics: dict[str, float]) -> str:
    shown = [k for k in _METRIC_ORDER if k in metrics] + [k for k in metrics if k not in _METRIC_ORDER]
    parts = []
    for key in shown:
        value = metrics[key]
        if key == "num_examples":
            parts.append(f"{key} {int(value):,}")
        elif key != "step":
            parts.append(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(parts)


def _json_line(event: str, payload: dict) -> str:
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in payload.items()}
    return json.dumps({"event": event, **clean})


def train_command(args: argparse.Namespace, distributed: bool) -> int:
    from rectrain.train.job import TrainJob

    config = load_config(args)

    def on_rank(env: ShardingEnv | None) -> int:
        job = TrainJob(config, env, progress_bar=not args.no_progress)
        if _is_reporting(env) and job.training.plan is not None:
            print(job.training.plan.report(), flush=True)
        summary = job.run()
        if _is_reporting(env):
            trained = summary.end.step - summary.start.step
            resumed = f" (resumed at step {summary.start.step})" if summary.start.step else ""
            print(
                f"trained {trained} steps{resumed} / {summary.end.examples - summary.start.examples:,} "
                f"examples in {summary.seconds:.1f} s ({summary.examples_per_s:,.0f} examples/s)"
            )
            if summary.eval_metrics:
                step = summary.eval_metrics["step"]
                print(f"eval at step {step}: {format_metrics(summary.eval_metrics)}")
            if summary.eval_error:
                print(f"eval at step {summary.end.step} failed (training is saved): {summary.eval_error}")
            if summary.checkpoint is not None:
                print(f"checkpoint: {summary.checkpoint}")
            if summary.stopped_by_signal:
                print(
                    f"stopped by SIGTERM after checkpointing (exit {EXIT_STOPPED}: not finished; run the "
                    "same command again to resume)"
                )
        # Every rank returns the same code: the run is not finished, so a launcher that restarts failed
        # jobs (torchrun --max-restarts, a Kubernetes Job) starts it again and it resumes. Exit 0 would
        # tell a Job that this pod's part of the work is complete.
        return EXIT_STOPPED if summary.stopped_by_signal else 0

    return run_on_ranks(on_rank, distributed, config)


def plan_command(args: argparse.Namespace, world_size: int) -> int:
    from rectrain.train.build import embedding_tables, make_plan

    config = load_config(args)
    if args.out:
        _check_out_file(Path(args.out))
    plan = make_plan(config, embedding_tables(config), world_size, env=None)
    print(plan.report())
    if args.out:
        plan.save(args.out)
        print(f"plan written to {args.out} (use it with planner.plan_file)")
    return 0


def _check_out_file(out: Path) -> None:
    """``--out`` must name a file in an existing directory (the message must not name a temp file)."""
    if out.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file name such as {out / 'plan.json'}")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: directory {out.parent} does not exist; create it first")


def eval_command(args: argparse.Namespace, distributed: bool) -> int:
    from rectrain.train.job import TrainJob
    from rectrain.train.preflight import check_run_paths

    config = load_config(args)
    directory = args.checkpoint or config.checkpoint.dir
    if directory is None:
        raise ConfigError("rectrain eval: give --checkpoint DIR or set checkpoint.dir in the config")
    check_run_paths(config, training=False)

    def on_rank(env: ShardingEnv | None) -> int:
        from rectrain.checkpoint import load_checkpoint

        job = TrainJob(config, env, progress_bar=False)
        info = load_checkpoint(Path(directory), model=job.training.model, step=args.step, env=env)
        metrics = job.evaluate()
        if _is_reporting(env):
            print(f"eval of {directory} at step {info.step}: {format_metrics(metrics)}")
            print(_json_line("eval", {"step": info.step, "checkpoint": str(directory), **metrics}))
        return 0

    return run_on_ranks(on_rank, distributed, config)


def bench_command(args: argparse.Namespace, distributed: bool) -> int:
    from rectrain.train.job import TrainJob
    from rectrain.train.pipeline import TrainPipelineBase, TrainPipelineSparseDist

    config = load_config(args)
    if args.data:
        return run_on_ranks(lambda env: _data_bench(config, args, env), distributed)

    def on_rank(env: ShardingEnv | None) -> int:
        job = TrainJob(config, env, progress_bar=False)
        world_size = 1 if env is None else env.world_size
        # data generation is not timed
        cached = [item.batch for _, item in zip(range(4), job.data.train_batches())]
        if not cached:
            raise ConfigError(f"{config.source}: data: no training batches to benchmark with")
        pipeline_type = TrainPipelineSparseDist if config.train.pipeline else TrainPipelineBase
        pipeline = pipeline_type(job.training.model, job.training.optimizer, job.training.device)
        batches = (cached[i % len(cached)] for i in range(args.warmup + args.steps + 1))
        for _ in range(args.warmup):
            pipeline.progress(batches)
        _barrier(env)
        start = time.perf_counter()
        for _ in range(args.steps):
            pipeline.progress(batches)
        _barrier(env)
        seconds = time.perf_counter() - start
        examples = args.steps * config.train.batch_size * world_size
        if _is_reporting(env):
            mode = "pipelined" if config.train.pipeline else "plain"
            print(
                f"{args.steps} steps ({mode}) of {config.train.batch_size} examples x {world_size} ranks "
                f"in {seconds:.2f} s: {1e3 * seconds / args.steps:.1f} ms/step"
            )
            print(f"rectrain bench examples/s {examples / seconds:.0f}")
        return 0

    return run_on_ranks(on_rank, distributed, config)


def _data_bench(config: RunConfig, args: argparse.Namespace, env: ShardingEnv | None) -> int:
    from rectrain.train.data_bench import run_data_bench

    lines = run_data_bench(config, args, env)
    if _is_reporting(env):
        print("\n".join(lines), flush=True)
    return 0


def _barrier(env: ShardingEnv | None) -> None:
    if env is not None and env.pg is not None:
        torch.distributed.barrier(group=env.pg)
