"""The input pipeline against the model: readers alone, conversion against an epoch, training from files.

    .venv/bin/python bench/data_pipeline.py [--rows 250000] [--convert-gb 1.0]
        [--world-sizes 1 2] [--steps 30] [--rounds 3] [--batch-size 512] [--prefetch 2 0] [--threads N]
        [--skip-train]

On Criteo-format rows (``write_synthetic_criteo``, 100,000 tokens a column; kept in /tmp/rectrain-data-bench):

1. readers alone, one process, the batches a rank of a 1-rank job reads (rows/s, best of ``--repeats``,
   interleaved): the line-by-line TSV reader, the vectorised one, converted data, the same rows as Parquet;
2. ``rectrain data convert`` of a TSV of ``--convert-gb`` GB (copies of the rows) against one epoch of
   training on it (the epoch at the rate measured in 3 on converted data, 1 rank);
3. training throughput of the DLRM Criteo example (examples/dlrm_criteo.toml, ``--batch-size`` per rank)
   from ``rectrain bench --data``: synthetic batches in memory, the file's batches in memory, the file through
   its reader, interleaved in one run per (file, world size, ``--prefetch`` depth: 0 reads in the training
   loop); 2 ranks run under torchrun on this machine (one thread each), 1 rank with ``--threads`` torch
   threads (default: torch's, one per core; on a machine other jobs load, 2 threads thrash, 1 is steadier).

Every ratio comes from one run. On a shared machine other load slows any stream; the interleaving spreads it.
The last line: ``data pipeline converted/synthetic <1-rank ratio> tsv/synthetic <1-rank ratio>``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machine import print_machine

from rectrain.datasets import CriteoConfig, CriteoDataset, SyntheticCriteoSpec, write_synthetic_criteo
from rectrain.datasets.columnar import ColumnarConfig, ColumnarDataset
from rectrain.datasets.convert import convert

ROOT = Path(__file__).resolve().parents[1]
WORK = Path("/tmp/rectrain-data-bench")
CONFIG = ROOT / "examples" / "dlrm_criteo.toml"


def make_data(rows: int) -> tuple[Path, Path, Path]:
    """(TSV, converted dir, Parquet file) of ``rows`` rows, made once and reused."""
    WORK.mkdir(parents=True, exist_ok=True)
    tsv = WORK / f"criteo_{rows}.tsv"
    if not tsv.exists():
        print(f"writing {rows:,} Criteo-format rows to {tsv} ...", flush=True)
        write_synthetic_criteo(tsv, SyntheticCriteoSpec(num_rows=rows, vocab_size=100_000))
    converted = WORK / f"criteo_{rows}_converted"
    if not (converted / "manifest.json").exists():
        convert(CriteoConfig(paths=[str(tsv)]), converted, overwrite=True)
    parquet = WORK / f"criteo_{rows}.parquet"
    if not parquet.exists():
        write_parquet(converted, parquet)
    return tsv, converted, parquet


def write_parquet(converted: Path, path: Path) -> None:
    """The converted rows as a Parquet file with label, int_*, cat_* columns (zstd, 64k-row groups)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rectrain.datasets.columnar.converted import ConvertedSource

    source = ConvertedSource([converted])
    rows = source.read(0, source.num_rows)
    names = source.manifest
    columns = {"label": rows.labels}
    columns |= {n: np.ascontiguousarray(rows.dense[:, i]) for i, n in enumerate(names.dense_features)}
    columns |= {n: rows.ids[i] for i, n in enumerate(names.sparse_features)}
    pq.write_table(pa.table(columns), path, compression="zstd", row_group_size=1 << 16)


def time_readers(tsv: Path, converted: Path, parquet: Path, batch_size: int, repeats: int) -> None:
    parquet_config = ColumnarConfig(
        paths=[str(parquet)],
        format="parquet",
        batch_size=batch_size,
        dense_columns=[f"int_{i}" for i in range(13)],
        sparse_columns=[f"cat_{i}" for i in range(26)],
        table_rows=[100_000] * 26,
    )
    readers = {
        "TSV, line by line (the old reader)": lambda: CriteoDataset(
            CriteoConfig(paths=[str(tsv)], batch_size=batch_size, parser="lines")
        ),
        "TSV, vectorised": lambda: CriteoDataset(CriteoConfig(paths=[str(tsv)], batch_size=batch_size)),
        "converted (safetensors parts)": lambda: ColumnarDataset(
            ColumnarConfig(paths=[str(converted)], batch_size=batch_size)
        ),
        "Parquet (zstd, same rows)": lambda: ColumnarDataset(parquet_config),
    }
    best = dict.fromkeys(readers, 0.0)
    for _ in range(repeats):
        for name, make in readers.items():
            start, rows = time.perf_counter(), 0
            for batch in make():
                rows += len(batch.labels)
            best[name] = max(best[name], rows / (time.perf_counter() - start))
    print(f"readers alone (1 process, batches of {batch_size}, best of {repeats}):")
    for name, rate in best.items():
        print(
            f"  {name:<36} {rate:>12,.0f} rows/s  ({rate / best['TSV, line by line (the old reader)']:.1f}x)"
        )


def time_conversion(tsv: Path, gigabytes: float) -> tuple[int, float, float]:
    """(rows, seconds, input bytes) of converting a TSV of about ``gigabytes`` GB."""
    big = WORK / f"criteo_{gigabytes:g}gb.tsv"
    if not big.exists():
        copies = max(1, round(gigabytes * 1e9 / tsv.stat().st_size))
        with open(big, "wb") as out:
            for _ in range(copies):
                with open(tsv, "rb") as f:
                    shutil.copyfileobj(f, out, 16 << 20)
    out_dir = WORK / "convert_timing"
    result = convert(CriteoConfig(paths=[str(big)]), out_dir, overwrite=True)
    shutil.rmtree(out_dir)
    return result.manifest.num_rows, result.seconds, result.input_bytes


def bench_training(data: Path, world_size: int, prefetch: int, a: argparse.Namespace) -> dict[str, float]:
    """``rectrain bench --data`` on ``world_size`` ranks: its ``rectrain bench *`` figures."""
    prefix = [sys.executable, "-m"]
    if world_size > 1:
        prefix += ["torch.distributed.run", "--nproc-per-node", str(world_size)]
        prefix += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]
    command = [*prefix, "rectrain", "bench", "--config", str(CONFIG), "--data", str(data)]
    command += [
        "--steps",
        str(a.steps),
        "--rounds",
        str(a.rounds),
        "--set",
        f"train.batch_size={a.batch_size}",
        "--set",
        f"data.prefetch={prefetch}",
    ]
    env = dict(os.environ)
    if world_size == 1 and a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    print("\n".join(f"    {line}" for line in lines if line.startswith("  ")))
    return {
        m[1]: float(m[2])
        for m in (re.match(r"rectrain bench (\S+) (?:examples/s )?([\d.]+)", x) for x in lines)
        if m
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=250_000)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--convert-gb", type=float, default=1.0, help="0 skips the conversion timing")
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefetch", type=int, nargs="+", default=[2], help="data.prefetch depths to time")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of 1-rank runs (default: torch's)")
    ap.add_argument("--skip-train", action="store_true")
    a = ap.parse_args()
    print_machine()
    tsv, converted, parquet = make_data(a.rows)
    time_readers(tsv, converted, parquet, a.batch_size, a.repeats)
    ratios: dict[tuple[str, int, int], float] = {}
    cpu_ratios: dict[tuple[str, int, int], float] = {}
    epoch_rate = 0.0
    if not a.skip_train:
        for world_size in a.world_sizes:
            for prefetch in a.prefetch:
                for name, data in (("converted", converted), ("tsv", tsv)):
                    print(f"{name} data, {world_size} rank(s), data.prefetch={prefetch}:", flush=True)
                    figures = bench_training(data, world_size, prefetch, a)
                    ratios[name, world_size, prefetch] = figures["data/baseline"]
                    cpu_ratios[name, world_size, prefetch] = figures["data/baseline-cpu"]
                    if name == "converted" and world_size == 1:
                        epoch_rate = max(epoch_rate, figures["data"])
        print(
            "training from files / on synthetic batches in memory (same run), wall time; CPU time per step:"
        )
        for key, ratio in ratios.items():
            name, world_size, prefetch = key
            goal = 0.9 if name == "converted" else 0.6
            verdict = "met" if ratio >= goal else "NOT met"
            print(
                f"  {name:<10} {world_size} rank(s), prefetch {prefetch}: {ratio:.1%} "
                f"(goal {goal:.0%}: {verdict}); CPU {cpu_ratios[key]:.1%}"
            )
    if a.convert_gb > 0:
        rows, seconds, size = time_conversion(tsv, a.convert_gb)
        line = (
            f"convert {size / 1e9:.2f} GB TSV ({rows:,} rows): {seconds:.1f} s, {rows / seconds:,.0f} rows/s"
        )
        if epoch_rate:
            epoch = rows / epoch_rate
            line += f"; one epoch of training on it (1 rank, converted): {epoch:.1f} s"
            line += f"; convert/epoch {seconds / epoch:.2f}"
        print(line)
    if ratios:
        first = a.prefetch[0]
        print(
            f"data pipeline converted/synthetic {ratios.get(('converted', 1, first), float('nan')):.3f} "
            f"tsv/synthetic {ratios.get(('tsv', 1, first), float('nan')):.3f}"
        )


if __name__ == "__main__":
    main()
