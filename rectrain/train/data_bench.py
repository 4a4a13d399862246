"""``rectrain bench --data FILE``: training throughput with the real reader against in-memory batches.

One model, one run: the same model trains in turn on synthetic batches held in memory (no data cost: the
model's speed; when the model's features suit the synthetic source), on FILE's first batches held in memory
(the same, with the file's id distribution), and on FILE through the reader a training run uses (prefetch
thread or DataLoader workers, as ``[data]`` says), ``--rounds`` times each, interleaved so that other load
on the machine falls on all of them. Each stream's rate is that of its fastest round (other load only slows
a round down), also as a fraction of the first stream's; the means over all rounds follow, then the CPU
time per step of this rank's process and the first stream's CPU time over it (``data/baseline-cpu``: what
the reader adds to a step's work, the steadier figure on a machine other jobs load). The in-memory
streams hold 64 distinct batches each, so that their embedding rows are not kept hot in the CPU caches by a
handful of batches repeated (the plain ``rectrain bench`` repeats 4).

FILE's source: a directory or manifest.json of converted data -> ``converted``; ``*.parquet`` -> ``parquet``
(columns from ``[data]``); otherwise the config's text source, or by extension (``.dat``/``.csv`` ->
``movielens``, else ``criteo``).
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from rectrain.distributed import ShardingEnv
from rectrain.errors import ConfigError
from rectrain.models.batch import Batch
from rectrain.train.config import RunConfig
from rectrain.train.data import RunData
from rectrain.train.pipeline import TrainPipelineBase, TrainPipelineSparseDist

_HELD = 64  # distinct in-memory batches per stream (a few would keep their rows hot in the CPU caches)


def infer_source(path: str, configured: str) -> str:
    """The data source that reads ``path`` (see the module doc)."""
    p = Path(path)
    if p.is_dir() or p.name == "manifest.json":
        return "converted"
    if p.suffix == ".parquet":
        return "parquet"
    if configured in ("criteo", "movielens"):
        return configured
    suffixes = [s for s in p.suffixes if s != ".gz"]
    return "movielens" if suffixes and suffixes[-1] in (".dat", ".csv") else "criteo"


def data_config(config: RunConfig, path: str) -> RunConfig:
    """``config`` training on ``path`` with no end (the epochs repeat) and no batches held out."""
    if not Path(path).exists():
        raise ConfigError(f"rectrain bench --data: {path} does not exist")
    data = replace(
        config.data, source=infer_source(path, config.data.source), paths=[path], eval_paths=[path]
    )
    train = replace(config.train, epochs=None, steps=None)  # endless: epochs repeat while the bench runs
    return replace(config, data=data, train=train)


def _synthetic_batches(config: RunConfig, rank: int, world_size: int, count: int) -> list[Batch] | None:
    """Synthetic batches shaped for the model, if the synthetic source can make them (features cat_0..)."""
    synthetic = replace(config, data=replace(config.data, source="synthetic", paths=[], eval_paths=[]))
    try:
        stream = RunData(synthetic, rank, world_size).train_batches()
    except ConfigError:
        return None
    return [item.batch for item in itertools.islice(stream, count)]


@dataclass
class _Stream:
    name: str
    batches: Iterator[Batch]
    pipeline: TrainPipelineBase
    rounds: list[float] = field(default_factory=list)  # seconds of each timed round
    cpu: float = 0.0  # CPU seconds of this process (all its threads) over the timed rounds


def _barrier(env: ShardingEnv | None) -> None:
    if env is not None and env.pg is not None:
        torch.distributed.barrier(group=env.pg)


def _time(stream: _Stream, steps: int, env: ShardingEnv | None) -> None:
    _barrier(env)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        stream.pipeline.progress(stream.batches)
    stream.cpu += time.process_time() - cpu
    _barrier(env)
    stream.rounds.append(time.perf_counter() - start)


def run_data_bench(config: RunConfig, args: argparse.Namespace, env: ShardingEnv | None) -> list[str]:
    """Time both streams on this rank; the lines rank 0 prints."""
    from rectrain.train.job import TrainJob

    real_config = data_config(config, args.data)
    job = TrainJob(real_config, env, progress_bar=False)
    rank, world_size = job.rank, job.world_size
    real = (item.batch for item in job.data.train_batches())
    held = _HELD
    cached_real = [item.batch for item in itertools.islice(job.data.train_batches(), held)]
    synthetic = _synthetic_batches(real_config, rank, world_size, held)
    pipeline_type = TrainPipelineSparseDist if config.train.pipeline else TrainPipelineBase
    t = job.training

    def stream(name: str, batches: Iterator[Batch]) -> _Stream:
        return _Stream(name, batches, pipeline_type(t.model, t.optimizer, t.device))

    streams = [stream("FILE's first batches, in memory", _cycle(cached_real))]
    if synthetic is not None:
        streams.insert(0, stream("synthetic batches, in memory", _cycle(synthetic)))
    streams.append(stream(f"{args.data} through the {real_config.data.source} reader", real))
    for s in streams:
        for _ in range(args.warmup):
            s.pipeline.progress(s.batches)
    for _ in range(args.rounds):
        for s in streams:
            _time(s, args.steps, env)
    return _report(streams, config, args, world_size)


def _cycle(batches: list[Batch]) -> Iterator[Batch]:
    return (batches[i % len(batches)] for i in itertools.count())


def _report(
    streams: list[_Stream], config: RunConfig, args: argparse.Namespace, world_size: int
) -> list[str]:
    """Each stream's rate in its fastest round: other load on a shared machine only ever slows a round down,
    so the fastest is the least disturbed (the mean over all rounds follows in brackets). Then this rank's
    CPU time per step (all threads of the process): on a crowded machine wall time says little, while CPU
    time per step still shows what the reader adds to the work of a step."""
    examples = args.steps * config.train.batch_size * world_size
    best = [examples / min(s.rounds) for s in streams]
    mean = [examples * len(s.rounds) / sum(s.rounds) for s in streams]
    cpu = [1e3 * s.cpu / (args.steps * len(s.rounds)) for s in streams]
    mode = "pipelined" if config.train.pipeline else "plain"
    lines = [
        f"{args.rounds} rounds x {args.steps} steps ({mode}) of {config.train.batch_size} examples x "
        f"{world_size} ranks, the streams in turn; best round (mean):"
    ]
    lines += [
        f"  {s.name}: {b:,.0f} examples/s ({b / best[0]:.1%}) ({m:,.0f}, {m / mean[0]:.1%}); "
        f"CPU {c:.1f} ms/step ({cpu[0] / c:.1%})"
        for s, b, m, c in zip(streams, best, mean, cpu)
    ]
    lines.append(f"rectrain bench baseline examples/s {best[0]:.0f}")
    if len(streams) == 3:
        lines.append(f"rectrain bench cached examples/s {best[1]:.0f}")
    lines += [
        f"rectrain bench data examples/s {best[-1]:.0f}",
        f"rectrain bench data/baseline {best[-1] / best[0]:.3f}",
        f"rectrain bench data/baseline-cpu {cpu[0] / cpu[-1]:.3f}",
    ]
    return lines
