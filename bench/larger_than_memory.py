"""Train and serve a DLRM larger than its memory cap: disk tables capped against RAM tables uncapped.

    python -m bench larger_than_memory                        # 6 x 400,000 x 128 fp32 (1.2 GB), 2 ranks
    python -m bench larger_than_memory --rows 4000000 --cap-gb 6 --serve-cap-gb 1.5   # the 12.3 GB model

Training: ``--ranks`` worker processes each train their row-wise share of every table (``rows / ranks``
rows; a DLRM step, fused row-wise Adagrad) on Zipf ids (exponent ``--zipf``, hot rows scattered over the
table as hashed ids are) and on uniform ids. Capped, the tables are ``storage = "disk"`` and all workers run
in one cgroup whose limit is ``--cap-gb`` (default: ``--baseline-gb`` per worker for the interpreter plus
``--cache-fraction`` of the tables), each with a row cache sized from its share of the cap (what is left
after the interpreter, the cache's bookkeeping and ``--page-cache-room`` of the share for the page cache;
``--cache-share`` sets it as a share of the tables instead) and the next batch's rows prefetched while a
step computes (as ``TrainPipelineSparseDist`` does); uncapped, the tables are in RAM and no cgroup is set.
Serving: the int8 package of the same model, loaded by ``--ranks`` workers (tables mapped), each sending
requests of Zipf ids one every ``--interval-ms`` (the same offered load capped and uncapped), capped at
``--serve-cap-gb``.

Measured steps: a user's long run sees a full cache whose hit rate has settled, so that is what the goal
line measures. Each training worker runs ``--warmup`` steps, then ``--steps`` **cold-cache** steps (the
cache still filling: every miss takes a never-used slot, no row is written back), then keeps training until
every cache is full (its misses evict rows) and the distinct-row hit rate of the last ``--steady-window``
steps is within 0.01 of the window before (at most ``--max-warmup`` more steps), then measures ``--steps``
**steady** steps. The capped run goes first; the uncapped run (RAM tables, no cache) then trains the same
batches for as many warm-up steps and measures the same steps, so both figures come from the same point of
a run. A 600,000-slot cache (the full size) fills in about 300 steps.

Prints the machine, disk and sizes, then one line per figure, value last: per run, the cold and steady
throughput and hit rates, major page faults per steady step; then ``capped / uncapped train throughput
zipf`` (steady: the goal line), ``... uniform``, the cold ones as ``cold-cache capped / uncapped train
throughput zipf``, ``capped / uncapped serve p99 zipf`` and ``oom kills`` (workers the kernel killed in the
caps). Needs root for the cgroup (v2 or v1).

A proxy of the full size, about 6 minutes: ``--rows 500000 --batch 128 --cap-gb 1.8 --steps 60 --no-serve
--id-kinds zipf``. A tenth of the rows and of the batch keeps ids per step over rows per rank (0.0082), so
at the same cache share the fill time and the hit rates are the full size's (the static top 30% of rows
would serve 0.870 of a batch's distinct rows against 0.874; measured steady 0.82-0.85 at 30%, as simulated
at full size). The interpreter does not shrink with the rows (0.32 GB of each rank's 0.9 GB share), so the
cap is not a tenth: at 1.8 GB the page cache holds little of the files and 1.2-1.5 page reads per missed
row go to the disk (the row's, and for most write-backs its page's first), as in the full size's profile.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import machine_line  # noqa: E402
from bench.memory_cap import MemoryCap, join  # noqa: E402

GB = 1e9


def _disk_line(path: Path) -> str:
    """The block device under ``path``: name, model and whether it rotates."""
    device = os.stat(path).st_dev
    name = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}").resolve().name
    block = Path("/sys/block") / name
    if not block.exists():  # a partition: its disk is the parent directory
        block = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}").resolve().parent
    model = (block / "device" / "model").read_text().strip() if (block / "device" / "model").exists() else "?"
    rotational = (block / "queue" / "rotational").read_text().strip() if (block / "queue").exists() else "?"
    kind = {"0": "SSD/virtual", "1": "rotating"}.get(rotational, "?")
    return f"disk: {block.name} ({model}, {kind}) under {path}"


def _config(args: argparse.Namespace, rows: int, storage: str):
    from rectrain.embedding import EmbeddingBagConfig
    from rectrain.models.config import ModelConfig

    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=args.dim, storage=storage)
        for i in range(args.tables)
    ]
    return ModelConfig(
        kind="dlrm",
        tables=tables,
        dense_in_features=13,
        dense_arch_layer_sizes=[128, args.dim],
        over_arch_layer_sizes=[128, 1],
    )


@functools.cache
def _zipf(rows: int, exponent: float):
    """The Zipf ranks' cumulative weights and the fixed permutation scattering them over the table."""
    import numpy as np

    cdf = np.cumsum(1.0 / np.arange(1, rows + 1, dtype=np.float64) ** exponent)
    return cdf, np.random.default_rng(12345).permutation(rows)


def _ids(kind: str, rows: int, count: int, exponent: float, seed: int):
    """``count`` ids over ``rows``: Zipf (rank r drawn with weight 1 / r^exponent, ranks scattered by a fixed
    permutation) or uniform."""
    import numpy as np

    gen = np.random.default_rng(seed)
    if kind == "uniform":
        return gen.integers(0, rows, count)
    cdf, scatter = _zipf(rows, exponent)
    ranks = np.searchsorted(cdf, gen.random(count) * cdf[-1])
    return scatter[np.minimum(ranks, rows - 1)]


def _requests(args: argparse.Namespace, rows: int, kind: str, batch: int, n: int, seed: int):
    """``n`` batches: dense inputs and a KJT of ``--pooling`` ids per example and table."""
    return [_request(args, rows, kind, batch, b, seed) for b in range(n)]


def _request(args: argparse.Namespace, rows: int, kind: str, batch: int, index: int, seed: int):
    """Batch ``index`` of a stream (its ids drawn from its own seed: the same batch capped and uncapped)."""
    import torch

    from rectrain.sparse import KeyedJaggedTensor

    keys = [f"t{i}" for i in range(args.tables)]
    ids = _ids(kind, rows, batch * args.pooling * len(keys), args.zipf, seed * 100_003 + index)
    lengths = torch.full((len(keys) * batch,), args.pooling, dtype=torch.int64)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(ids).long(), lengths=lengths)
    return torch.randn(batch, 13, generator=torch.Generator().manual_seed(seed + index)), kjt


def _memory() -> dict[str, int]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmHWM", "RssAnon", "RssFile")}


def _cache_bytes(args: argparse.Namespace, rows: int) -> int:
    """The row cache of the worker's one disk kernel: ``--cache-share`` of its rows and row-wise state where
    given; else what is left of the rank's share of the cap once the interpreter (``--baseline-gb``, or
    what it holds now if more), the cache's per-row bookkeeping (8 bytes a row: slot map and score) and the
    page-cache room (``--page-cache-room`` of the share: misses and write-backs go through it) are taken."""
    tables = args.tables * rows * (args.dim * 4 + 4)
    if args.cache_share is not None or args.rank_share is None:
        return int((args.cache_share or 0.3) * tables)
    interpreter = max(args.baseline_gb * GB, _memory()["RssAnon"])
    left = args.rank_share * (1 - args.page_cache_room) - interpreter - 8 * args.tables * rows
    return int(min(tables, max(0.0, left)))


def _train_worker(args: argparse.Namespace) -> dict:
    import torch

    from rectrain.embedding import FusedOptimizerConfig, disk_tables
    from rectrain.models import Batch, build_train_model
    from rectrain.train.pipeline import prefetching_modules

    torch.set_num_threads(args.threads)
    rows = args.rows // args.ranks
    cache = _cache_bytes(args, rows)
    disk_tables.configure(disk_tables.DiskTablesSettings(dir=args.work, cache_bytes=cache))
    cfg = _config(args, rows, args.storage)
    torch.manual_seed(args.rank)
    started = time.perf_counter()
    model = build_train_model(cfg, fused_optimizer=FusedOptimizerConfig("rowwise_adagrad", lr=0.01))
    build_s = time.perf_counter() - started
    dense = torch.optim.Adagrad([p for p in model.parameters() if p.requires_grad], lr=0.01)
    prefetchers = prefetching_modules(model)
    kernels = [b for m in model.modules() for b in getattr(m, "batches", [])]
    caches = [b.cache for b in kernels if getattr(b, "cache", None) is not None]
    seed = 1000 * args.rank
    cold = range(args.warmup, args.warmup + args.steps)
    # Per step: seconds and the caches' (distinct rows, rows read, ids, ids read by the step itself).
    times: list[float] = []
    counts: list[tuple[int, int, int, int]] = []
    measure_from = None  # the first steady step
    settled = args.warm_steps is not None  # (the uncapped run measures where the capped one settled)
    step, current = 0, _request(args, rows, args.ids, args.batch, 0, seed)
    while measure_from is None or step < measure_from + args.steps:
        following = _request(args, rows, args.ids, args.batch, step + 1, seed)
        features, kjt = current
        labels = torch.randint(0, 2, (args.batch,), generator=torch.Generator().manual_seed(step))
        if step == measure_from:
            faults = _major_faults()
        before = _cache_counts(caches)
        begin = time.perf_counter()
        if step == 0:
            for module in prefetchers:
                module.prefetch(kjt)
        loss, _ = model(Batch(features, kjt, labels))
        for module in prefetchers:  # as TrainPipelineSparseDist does: the next batch's rows load meanwhile
            module.prefetch(following[1])
        dense.zero_grad()
        loss.backward()
        dense.step()
        times.append(time.perf_counter() - begin)
        counts.append(tuple(a - b for a, b in zip(_cache_counts(caches), before)))
        step, current = step + 1, following
        if measure_from is None and step >= cold.stop:
            if args.warm_steps is not None:
                measure_from = max(step, args.warm_steps)
            elif _steady(caches, counts, args.steady_window):
                measure_from, settled = step, True
            elif step >= cold.stop + args.max_warmup:
                measure_from = step
    for c in caches:  # the last prefetch (of a batch never trained on) ends before the figures
        c.wait()
    steady = range(measure_from, measure_from + args.steps)
    return {
        "major_faults_per_step": (_major_faults() - faults) / args.steps,
        "cold": _figures(args.batch, times, counts, cold),
        "steady": _figures(args.batch, times, counts, steady),
        "warm_steps": measure_from,
        "full": all(c.full for c in caches),
        "settled": settled,
        "build_s": build_s,
        "cache_bytes": cache,
        **_memory(),
    }


def _major_faults() -> int:
    """Page faults of this process that waited for a disk read."""
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[9])


def _cache_counts(caches: list) -> tuple[int, int, int, int]:
    return (
        sum(c.lookups for c in caches),
        sum(c.misses for c in caches),
        sum(c.id_lookups for c in caches),
        sum(c.id_misses for c in caches),
    )


def _steady(caches: list, counts: list[tuple[int, int, int, int]], window: int) -> bool:
    """Every cache full (evicting) and the distinct-row hit rate of the last ``window`` steps within 0.01
    of the ``window`` before (a RAM model, with no caches, is steady at once)."""
    if not caches:
        return True
    if not all(c.full for c in caches) or len(counts) < 2 * window:
        return False
    last, before = _rate(counts[-window:], 0), _rate(counts[-2 * window : -window], 0)
    return abs(last - before) < 0.01


def _rate(counts: list[tuple[int, int, int, int]], which: int) -> float | None:
    """The hit rate of distinct rows (``which`` 0) or ids (2) over ``counts``; None without lookups."""
    asked = sum(c[which] for c in counts)
    return 1.0 - sum(c[which + 1] for c in counts) / asked if asked else None


def _figures(batch: int, times: list[float], counts: list, steps: range) -> dict:
    chosen = [counts[s] for s in steps]
    return {
        "examples_per_s": batch * len(steps) / sum(times[s] for s in steps),
        "hit_rate": _rate(chosen, 0),
        "id_hit_rate": _rate(chosen, 2),
    }


def _serve_worker(args: argparse.Namespace) -> dict:
    import torch

    from recserve.runtime import Predictor

    torch.set_num_threads(args.threads)
    predictor = Predictor.load(args.package, verify=False)
    requests = _requests(args, args.rows, "zipf", args.serve_batch, args.requests, seed=7 + args.rank)
    latencies, errors, next_at = [], 0, time.perf_counter()
    for i, (dense, kjt) in enumerate(requests):
        next_at += args.interval_ms / 1000
        begin = time.perf_counter()
        try:
            predictor.predict(dense, kjt)
        except Exception:  # counted, not fatal: the figure is the error count
            errors += 1
        if i >= args.requests // 10:  # the first tenth warms up
            latencies.append(time.perf_counter() - begin)
        time.sleep(max(0.0, next_at - time.perf_counter()))
    latencies.sort()
    return {"p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))], "errors": errors, **_memory()}


def _worker_main(args: argparse.Namespace) -> None:
    if args.cgroup:
        join(args.cgroup)  # before anything is allocated: every page of the worker is charged to the cap
    result = _train_worker(args) if args.worker == "train" else _serve_worker(args)
    print("RESULT " + json.dumps(result), flush=True)


def _run_workers(
    argv: list[str], ranks: int, cap: MemoryCap | None, timeout: float
) -> tuple[list[dict | None], int]:
    """Start ``ranks`` workers (in ``cap``), wait; their results (None for a worker that died) and how many
    died by SIGKILL."""
    base = [sys.executable, str(Path(__file__).resolve()), *argv]
    procs = [
        subprocess.Popen(
            [*base, "--rank", str(rank), *(["--cgroup", str(cap.path)] if cap else [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    results, killed = [], 0
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        results.append(json.loads(line[7:]) if line else None)
        killed += proc.returncode == -9
    return results, killed


def _make_package(args: argparse.Namespace, out: Path) -> Path:
    """Export the int8 package of a model with these tables (its rows mapped from disk while exporting)."""
    import torch

    from recserve.export import export_package, synthetic_sample
    from rectrain.embedding import FusedOptimizerConfig, disk_tables
    from rectrain.models import build_train_model

    disk_tables.configure(disk_tables.DiskTablesSettings(dir=args.work))
    cfg = _config(args, args.rows, "disk")
    torch.manual_seed(0)
    model = build_train_model(cfg, fused_optimizer=FusedOptimizerConfig("rowwise_adagrad"))
    return export_package(
        out, model_config=cfg, model=model.model, dtype="int8", accuracy_sample=synthetic_sample(cfg, 256)
    )


def _evict(directory: Path) -> None:
    """Drop ``directory``'s files from the page cache (only ours: the machine's other caches stay)."""
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cap_bytes(gb: float | None, baseline_gb: float, workers: int, fraction: float, data_bytes: float) -> int:
    return int(gb * GB if gb is not None else workers * baseline_gb * GB + fraction * data_bytes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=6)
    parser.add_argument("--rows", type=int, default=400_000, help="rows per table (all ranks together)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1024, help="examples per rank and step")
    parser.add_argument("--pooling", type=int, default=16, help="ids per example and table")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="steps before the cold-cache measurement")
    parser.add_argument(
        "--max-warmup",
        type=int,
        default=1000,
        help="most steps after the cold ones until the steady measurement",
    )
    parser.add_argument(
        "--steady-window", type=int, default=25, help="steps per hit-rate window (steady test)"
    )
    parser.add_argument("--zipf", type=float, default=1.05)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--cap-gb", type=float, default=None, help="training cap, all ranks together")
    parser.add_argument("--serve-cap-gb", type=float, default=None, help="serving cap, all workers together")
    parser.add_argument("--baseline-gb", type=float, default=0.45, help="per worker, in the default caps")
    parser.add_argument("--cache-fraction", type=float, default=0.4, help="of the tables, in the default cap")
    parser.add_argument(
        "--cache-share",
        type=float,
        default=None,
        help="of a worker's tables, its disk row cache (default: from the cap)",
    )
    parser.add_argument(
        "--page-cache-room",
        type=float,
        default=0.15,
        help="of a rank's share of the cap, kept for the page cache",
    )
    parser.add_argument("--serve-cache-fraction", type=float, default=0.2, help="of the package, likewise")
    parser.add_argument("--serve-batch", type=int, default=64)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--dir", default=None, help="work directory on the disk to measure (default: tmp)")
    parser.add_argument("--no-serve", action="store_true")
    parser.add_argument("--id-kinds", default="zipf,uniform", help="which id distributions to train on")
    # Worker-only arguments.
    parser.add_argument("--worker", choices=["train", "serve"], help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cgroup", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--storage", default="ram", help=argparse.SUPPRESS)
    parser.add_argument("--ids", default="zipf", help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--package", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warm-steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rank-share", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker_main(args)
        return 0

    work = Path(tempfile.mkdtemp(prefix="rectrain-ltm-", dir=args.dir))
    table_bytes = args.tables * args.rows * args.dim * 4
    print(machine_line(), flush=True)
    print(_disk_line(work), flush=True)
    print(
        f"model: {args.tables} x {args.rows:,} x {args.dim} fp32 = {table_bytes / GB:.2f} GB, "
        f"{args.ranks} ranks"
    )
    common = [
        *("--tables", str(args.tables), "--rows", str(args.rows), "--dim", str(args.dim)),
        *("--ranks", str(args.ranks), "--batch", str(args.batch), "--pooling", str(args.pooling)),
        *("--steps", str(args.steps), "--warmup", str(args.warmup), "--zipf", str(args.zipf)),
        *("--max-warmup", str(args.max_warmup), "--steady-window", str(args.steady_window)),
        *(
            "--threads",
            str(args.threads),
            "--work",
            str(work),
            "--page-cache-room",
            str(args.page_cache_room),
        ),
        *(("--cache-share", str(args.cache_share)) if args.cache_share is not None else ()),
        *("--baseline-gb", str(args.baseline_gb)),
    ]
    cap_bytes = _cap_bytes(args.cap_gb, args.baseline_gb, args.ranks, args.cache_fraction, table_bytes)
    print(f"training cap: {cap_bytes / GB:.2f} GB for {args.ranks} ranks", flush=True)
    oom = 0
    try:
        throughput: dict[tuple[str, str, str], float] = {}
        kinds = args.id_kinds.split(",")
        for ids in kinds:
            warm_steps = None
            # Capped first: the uncapped reference then warms up for as many steps and measures the same ones.
            for capped in (True, False):
                cap = MemoryCap.create(f"rectrain-ltm-{os.getpid()}", cap_bytes) if capped else None
                storage = "disk" if capped else "ram"
                argv = [*common, "--worker", "train", "--storage", storage, "--ids", ids]
                if capped:
                    argv += ["--rank-share", str(cap_bytes / args.ranks)]
                if warm_steps is not None:
                    argv += ["--warm-steps", str(warm_steps)]
                results, killed = _run_workers(argv, args.ranks, cap, timeout=3600)
                if cap is not None:
                    oom += max(cap.oom_kills(), killed)
                    print(f"{ids} capped: cgroup peak GB {cap.peak_bytes() / GB:.2f}")
                    cap.remove()
                label = "capped" if capped else "uncapped"
                done = [r for r in results if r]
                for rank, r in enumerate(results):
                    if r:
                        print(
                            f"{ids} {label} rank {rank}: build s {r['build_s']:.1f}, peak RSS GB "
                            f"{r['VmHWM'] / GB:.2f} (anon {r['RssAnon'] / GB:.2f}), "
                            + (f"row cache GB {r['cache_bytes'] / GB:.2f}, " if capped else "")
                            + "measured from step "
                            f"{r['warm_steps']} (caches full: {r['full']}, settled: {r['settled']}), "
                            f"major faults per steady step {r['major_faults_per_step']:.0f}"
                        )
                if capped and done:
                    warm_steps = max(r["warm_steps"] for r in done)
                for phase in ("cold", "steady"):
                    rates = [r[phase]["hit_rate"] for r in done if r[phase]["hit_rate"] is not None]
                    if rates:
                        per_id = [r[phase]["id_hit_rate"] for r in done]
                        rate = sum(rates) / len(rates)
                        print(f"{ids} {label} {phase} cache hit rate, distinct rows {rate:.3f}")
                        print(f"{ids} {label} {phase} cache hit rate, ids {sum(per_id) / len(per_id):.3f}")
                    value = sum(r[phase]["examples_per_s"] for r in done) if len(done) == args.ranks else 0.0
                    throughput[(ids, label, phase)] = value
                    print(f"{label} {phase} train throughput {ids} examples/s {value:.0f}", flush=True)
                print(f"{ids} {label} load average {os.getloadavg()[0]:.1f}")
        for ids in kinds:
            for phase, name in (("cold", "cold-cache "), ("steady", "")):
                ratio = throughput[(ids, "capped", phase)] / max(throughput[(ids, "uncapped", phase)], 1e-9)
                print(f"{name}capped / uncapped train throughput {ids} {ratio:.3f}", flush=True)

        if not args.no_serve:
            package = _make_package(args, work / "package")
            package_bytes = sum(f.stat().st_size for f in package.iterdir() if f.is_file())
            serve_cap = _cap_bytes(
                args.serve_cap_gb, args.baseline_gb, args.ranks, args.serve_cache_fraction, package_bytes
            )
            print(
                f"package GB {package_bytes / GB:.2f}; serving cap: {serve_cap / GB:.2f} GB for "
                f"{args.ranks} workers"
            )
            serve = [
                *common,
                *("--worker", "serve", "--package", str(package), "--serve-batch", str(args.serve_batch)),
                *("--requests", str(args.requests), "--interval-ms", str(args.interval_ms)),
            ]
            p99 = {}
            for capped in (False, True):
                _evict(package)  # both runs start from a cold page cache for the package
                cap = MemoryCap.create(f"rectrain-ltm-serve-{os.getpid()}", serve_cap) if capped else None
                results, killed = _run_workers(serve, args.ranks, cap, timeout=3600)
                if cap is not None:
                    oom += max(cap.oom_kills(), killed)
                    cap.remove()
                label = "capped" if capped else "uncapped"
                done = [r for r in results if r]
                errors = sum(r["errors"] for r in done) + (args.ranks - len(done)) * args.requests
                p99[label] = max((r["p99_ms"] for r in done), default=float("inf"))
                print(f"{label} serve errors {errors}")
                print(f"{label} serve p99 zipf ms {p99[label]:.2f}", flush=True)
            print(f"capped / uncapped serve p99 zipf {p99['capped'] / p99['uncapped']:.3f}")
        print(f"oom kills {oom}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
