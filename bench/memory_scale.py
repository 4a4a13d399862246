"""Peak resident memory of every stage of a large model's life: train (1 and 2 ranks), save, resume (on
another world size), export to int8, serve with 1 and 2 workers.

    python bench/memory_scale.py                        # 4 tables x 2,000,000 x 128 fp32 (4.1 GB)
    python bench/memory_scale.py --tables 6 --rows 4000000 --resume-ranks 3 --train-ranks 2   # 12.3 GB

Each stage runs the user's command (``rectrain train``, ``torchrun ... rectrain train``, ``recserve export``,
``recserve serve``) as a subprocess; the process tree is polled every 0.1 s and each process's VmHWM (peak
resident set, file-backed pages included) and largest RssAnon (private memory) are reported beside the model's
size, the largest shard a rank owns, and their ratios. Serving is measured after the package is loaded and a
few requests were answered; its "private" column is what the page cache cannot share between workers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import machine_line  # noqa: E402

GB = 1e9
_RECSERVE = [sys.executable, "-c", "import sys; from recserve.cli import main; sys.exit(main())"]


@dataclass
class Peak:
    """The largest VmHWM and RssAnon seen for one process."""

    label: str
    hwm: int = 0
    anon: int = 0


@dataclass
class Stage:
    name: str
    processes: list[Peak] = field(default_factory=list)
    seconds: float = 0.0


def _status(pid: int) -> dict[str, int]:
    values = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "RssAnon", "PPid"):
                    values[key] = int(rest.split()[0]) * (1024 if key != "PPid" else 1)
    except (OSError, ValueError):
        pass
    return values


def _children(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _status(int(entry)).get("PPid")
            if ppid is not None:
                parents[int(entry)] = ppid
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                found.append(pid)
                frontier.append(pid)
    return found


def _label(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return str(pid)
    rank = next((e[5:].decode() for e in environ if e.startswith(b"RANK=")), None)
    text = " ".join(a.decode(errors="replace") for a in args if a)
    if "torchrun" in text or "torch.distributed.run" in text:
        return "torchrun agent"
    if "resource_tracker" in text:
        return "resource tracker"
    if "multiprocessing" in text:
        return f"worker {pid}"
    if rank is not None:
        return f"rank {rank}"
    return "server" if " serve " in text else "process"


class Watcher:
    """Polls a process and its descendants, keeping each one's peaks."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.peaks = process, {}

    def poll(self) -> None:
        for pid in [self.process.pid, *_children(self.process.pid)]:
            status = _status(pid)
            if "VmHWM" not in status:
                continue
            peak = self.peaks.setdefault(pid, Peak(_label(pid)))
            peak.hwm = max(peak.hwm, status["VmHWM"])
            peak.anon = max(peak.anon, status.get("RssAnon", 0))

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            self.poll()
            if time.monotonic() > deadline:
                self.process.kill()
                raise TimeoutError(f"{self.process.args} ran past {timeout} s")
            time.sleep(0.1)
        return self.process.returncode


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    )
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_stage(name: str, command: list[str], timeout: float, threads: int = 1) -> Stage:
    started = time.monotonic()
    process = subprocess.Popen(command, env=_env(threads), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watcher = Watcher(process)
    code = watcher.wait(timeout)
    output = process.stdout.read().decode(errors="replace")
    if code != 0:
        raise RuntimeError(f"{name}: {' '.join(command)} exited with {code}:\n{output[-4000:]}")
    top = [p for pid, p in watcher.peaks.items() if p.label != "torchrun agent"] or list(
        watcher.peaks.values()
    )
    return Stage(name, sorted(top, key=lambda p: p.label), time.monotonic() - started)


def write_config(path: Path, args: argparse.Namespace, ckpt: Path | None) -> None:
    tables = ",\n".join(
        f'  {{ name = "t{i}", num_embeddings = {args.rows}, embedding_dim = {args.dim}, '
        f'feature_names = ["cat_{i}"] }}'
        for i in range(args.tables)
    )
    path.write_text(
        f"""[model]
kind = "dlrm"
dense_in_features = 13
dense_arch_layer_sizes = [64, {args.dim}]
over_arch_layer_sizes = [64, 1]
tables = [
{tables}
]

[data]
source = "synthetic"
ids_per_feature = [1, 4]

[optimizer]
sparse = "rowwise_adagrad"
sparse_lr = 0.05

[train]
batch_size = {args.batch}
steps = {args.steps}
log_every = {args.steps}
seed = 0
device = "cpu"
"""
        + ("" if ckpt is None else f'\n[checkpoint]\ndir = "{ckpt}"\nkeep_last = 1\n')
    )


def _torchrun(ranks: int, *rest: str) -> list[str]:
    if ranks == 1:
        return [sys.executable, "-m", "rectrain", *rest]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "-m",
        "rectrain",
        *rest,
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_stage(package: Path, workers: int, timeout: float) -> Stage:
    """``recserve serve --workers N``: peaks after loading and answering a few requests."""
    from recserve.client import PredictorClient
    from recserve.runtime.package import read_manifest

    port = _free_port()
    command = [*_RECSERVE, "serve", "--package", str(package), "--port", str(port)]
    command += ["--workers", str(workers), "--metrics-port", "-1"]
    started = time.monotonic()
    process = subprocess.Popen(command, env=_env(1), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = Watcher(process)
    try:
        client = PredictorClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + timeout
        while True:
            watcher.poll()
            try:
                client.wait_ready(timeout=1.0)
                break
            except Exception:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"recserve serve exited or never became ready ({process.returncode})"
                    ) from None
        import torch

        from rectrain.sparse import KeyedJaggedTensor

        manifest = read_manifest(package)
        features = manifest.feature_names
        for _ in range(20):
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=features,
                values=torch.randint(0, 1000, (len(features) * 8,)),
                lengths=torch.ones(len(features) * 8, dtype=torch.int64),
            )
            client.predict(torch.randn(8, manifest.dense_in_features), kjt)
            watcher.poll()
        time.sleep(1.0)
        watcher.poll()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    peaks = sorted(watcher.peaks.values(), key=lambda p: p.label)
    return Stage(f"serve, {workers} worker{'s' if workers > 1 else ''}", peaks, time.monotonic() - started)


def report(stages: list[Stage], args: argparse.Namespace, package_bytes: int | None) -> None:
    model = args.tables * args.rows * args.dim * 4
    table = args.rows * args.dim * 4
    print(machine_line())
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        print(f"memory: {total / GB:.1f} GB")
    except (ValueError, OSError):
        pass
    print(
        f"model: {args.tables} tables x {args.rows:,} x {args.dim} fp32 = {model / GB:.2f} GB "
        f"(largest table {table / GB:.2f} GB); table-wise shard per rank at 2 ranks "
        f"{-(-args.tables // 2) * table / GB:.2f} GB"
        + (f"; int8 package {package_bytes / GB:.2f} GB" if package_bytes else "")
    )
    print(f"{'stage':<26} {'process':<16} {'peak RSS GB':>11} {'private GB':>10} {'x model':>8} {'s':>6}")
    for stage in stages:
        for peak in stage.processes:
            print(
                f"{stage.name:<26} {peak.label:<16} {peak.hwm / GB:>11.2f} {peak.anon / GB:>10.2f} "
                f"{peak.hwm / model:>8.2f} {stage.seconds:>6.0f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--train-ranks", default="1,2", help="world sizes to train at (the last one saves)")
    parser.add_argument("--resume-ranks", type=int, default=2, help="world size that resumes the checkpoint")
    parser.add_argument("--workers", default="1,2", help="serving worker counts")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory, removed")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument(
        "--skip-training", action="store_true", help="export and serve the checkpoint already in --workdir"
    )
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="memory_scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt, package, config = workdir / "ckpt", workdir / "package", workdir / "model.toml"
    write_config(config, args, ckpt)
    no_checkpoint = workdir / "train_only.toml"
    write_config(no_checkpoint, args, None)
    stages = []
    try:
        ranks = [int(r) for r in args.train_ranks.split(",")] if not args.skip_training else []
        for world in ranks[:-1]:
            cmd = _torchrun(world, "train", "--config", str(no_checkpoint))
            stages.append(run_stage(f"train, {world} rank{'s' if world > 1 else ''}", cmd, args.timeout))
        if ranks:
            cmd = _torchrun(ranks[-1], "train", "--config", str(config))
            stages.append(run_stage(f"train + save, {ranks[-1]} ranks", cmd, args.timeout))
            steps = f"train.steps={args.steps + 1}"
            cmd = _torchrun(args.resume_ranks, "train", "--config", str(config), "--set", steps)
            stages.append(run_stage(f"resume + save, {args.resume_ranks} ranks", cmd, args.timeout))
        cmd = [*_RECSERVE, "export", "--checkpoint", str(ckpt), "--out", str(package)]
        stages.append(run_stage("export int8", [*cmd, "--dtype", "int8", "--overwrite"], args.timeout))
        package_bytes = sum(f.stat().st_size for f in package.iterdir())
        for workers in (int(w) for w in args.workers.split(",")):
            stages.append(serve_stage(package, workers, args.timeout))
    finally:
        report(stages, args, package_bytes if package.exists() else None)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
