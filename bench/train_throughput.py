"""Training throughput of DLRM under DistributedModelParallel on the standard workload (docs/benchmarks.md).

Mirrors bench/torchrec_reference.py (train) step for step: the same batches (a generator seeded
``1000 * rank + step``, 4 cached per rank), 3 warm-up steps, then ``--steps`` timed steps between barriers;
gloo, one spawned process per rank, ``cores // world_size`` threads each. Ranks meet through a FileStore in a
temp dir (no port). The planner picks the plan; tables use fused row-wise Adagrad (lr 0.05), the dense part
Adagrad (lr 0.05). ``--batch`` is per rank (the workload's is 2048).

    .venv/bin/python bench/train_throughput.py --world-size 1|2 [--steps 20] [--batch 2048] [--pipeline]
        [--compare] [--peer-python PATH] [--profile STEPS] [--repeats N] [--device cpu|cuda]

``--device cuda`` runs rank r on GPU r over NCCL (world size at most the visible GPUs) with the model built
as a user would: the collection on the CPU, ``DistributedModelParallel(device=cuda:r)`` moving its shards and
the dense part; the batches are drawn on the CPU as on cpu, then copied once (the pipelines copy them
themselves), and every clock read waits for the GPU.

``--pipeline`` times the training pipelines on the same model and batches: ``TrainPipelineBase`` (the plain
loop: load, forward, backward, step) against ``TrainPipelineSparseDist`` (the next batch's input all-to-all
in flight during this batch's compute), and prints both and their ratio; the last line is then the pipelined
figure. Without it the step is the hand-written loop the TorchRec script runs.
``--repeats N`` alternates N runs of each and reports each one's best run: on a shared machine other load only
ever slows a run down, so the fastest is the least disturbed.
``--compare`` also runs the TorchRec reference (bench/torchrec_reference.py, in its own venv built by
scripts/torchrec_venv.sh on first use, or with ``--peer-python`` / ``$RECTRAIN_PEER_PYTHON``) on the same
device and batch, and on cpu the compute bound (compute_bound.py, CPU-only), prints them and the
ratios. ``--profile`` profiles rank 0 over extra steps
after timing (torch.profiler op table, then cProfile's top Python functions). The last line is always
``rectrain train examples/s <global examples per second>``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import print_machine
from torchrec_reference import check_gpus, peer_python

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig, KeyedJaggedTensor
from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.embedding.backward_choice import BackwardChoice
from rectrain.models import DLRM, Batch, DLRMTrain
from rectrain.train import TrainPipelineBase, TrainPipelineSparseDist

T, E, D, DENSE, B, L = 8, 100_000, 64, 13, 2048, 20
LR = 0.05
BENCH = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Run:
    """One measurement, as every spawned rank receives it."""

    world_size: int
    steps: int
    batch: int = B  # examples per rank
    device: str = "cpu"  # "cpu" or "cuda"
    mode: str = "loop"  # "loop" (hand-written), "plain" or "pipelined"
    profile_steps: int = 0


def rank_device(run: Run, rank: int) -> torch.device:
    """This rank's device; on cuda also the current device, which NCCL and ``comm_device`` rely on."""
    if run.device == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def settle(device: torch.device) -> None:
    """Wait until every rank, and on a GPU every queued kernel, is done: what a clock read may follow."""
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_batch(rank: int, step: int, batch: int = B) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """The peer script's batch for (rank, step), draw for draw."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    lengths = torch.randint(1, 2 * L, (T * batch,), generator=g)
    values = torch.randint(0, E, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(T)], values=values, lengths=lengths
    )
    dense = torch.randn(batch, DENSE, generator=g)
    labels = torch.randint(0, 2, (batch,), generator=g).float()
    return dense, kjt, labels


def build(
    env: ShardingEnv, device: torch.device, batch: int, train_wrapper: bool = False
) -> tuple[DistributedModelParallel, torch.optim.Optimizer]:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=D, num_embeddings=E, feature_names=[f"f{i}"])
        for i in range(T)
    ]
    # Built on the CPU, as a user builds it: DistributedModelParallel copies each shard to ``device``.
    ebc = EmbeddingBagCollection(
        tables, fused_optimizer=FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=LR)
    )
    model = DLRM(
        ebc,
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[512, 256, D],
        over_arch_layer_sizes=[512, 256, 1],
    )
    if train_wrapper:  # the pipelines call model(batch) -> (loss, ...)
        model = DLRMTrain(model)
    dmp = DistributedModelParallel(model, env=env, device=device, batch_size=batch)
    opt = torch.optim.Adagrad([p for n, p in dmp.named_parameters() if "sparse_arch" not in n], lr=LR)
    return dmp, opt


def profile_rank(step: Callable[[int], None], steps: int, rank: int, device: torch.device) -> None:
    """Run ``steps`` more steps on every rank; rank 0 prints where its time goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            step(i)
    prof_c = cProfile.Profile()
    prof_c.enable()
    for i in range(steps):
        step(i)
    prof_c.disable()
    if rank == 0:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
        out = io.StringIO()
        pstats.Stats(prof_c, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue(), flush=True)


def hand_written_step(
    dmp: DistributedModelParallel, opt: torch.optim.Optimizer, rank: int, device: torch.device, batch: int
) -> Callable[[int], None]:
    """The TorchRec script's loop body over 4 cached batches (on ``device``, as the script caches them)."""
    lossf = torch.nn.BCEWithLogitsLoss()
    data = [make_batch(rank, s, batch) for s in range(4)]
    if device.type != "cpu":
        data = [tuple(part.to(device) for part in parts) for parts in data]

    def step(i: int) -> None:
        dense, kjt, labels = data[i % 4]
        logits = dmp(dense, kjt).squeeze(-1)
        loss = lossf(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def pipeline_step(
    dmp: DistributedModelParallel,
    opt: torch.optim.Optimizer,
    rank: int,
    device: torch.device,
    batch: int,
    pipelined: bool,
) -> Callable[[int], None]:
    """One ``progress()`` of a training pipeline per call, over the same 4 cached batches, endlessly.

    The batches stay on the CPU: copying them to ``device`` is part of the pipeline's work."""
    data = [Batch(*make_batch(rank, s, batch)) for s in range(4)]
    batches = (data[i % 4] for i in itertools.count())
    pipeline_type = TrainPipelineSparseDist if pipelined else TrainPipelineBase
    pipeline = pipeline_type(dmp, opt, device)
    return lambda i: pipeline.progress(batches)


def run_rank(rank: int, run: Run, store_dir: str, out) -> None:
    device = rank_device(run, rank)
    ws = run.world_size
    store = dist.FileStore(os.path.join(store_dir, "store"), ws)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=ws
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ws))
    t0 = time.perf_counter()
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    dmp, opt = build(env, device, run.batch, train_wrapper=run.mode != "loop")
    setup_s = time.perf_counter() - t0
    if run.mode == "loop":
        step = hand_written_step(dmp, opt, rank, device, run.batch)
    else:
        step = pipeline_step(dmp, opt, rank, device, run.batch, pipelined=run.mode == "pipelined")

    for i in range(3):
        step(i)
    settle(device)
    t = time.perf_counter()
    for i in range(run.steps):
        step(i)
    settle(device)
    dt = time.perf_counter() - t
    if rank == 0:
        path = next(iter(dmp.plan.plan))
        plan = {name: s.sharding_type.value for name, s in dmp.plan.get_plan_for_module(path).items()}
        kernel = dmp.cpu_backward[path]
        out.put((ws * run.batch * run.steps / dt, 1e3 * dt / run.steps, setup_s, plan, kernel))
    if run.profile_steps:
        profile_rank(step, run.profile_steps, rank, device)
    dist.destroy_process_group()


def run_ours(run: Run) -> tuple[float, float, float, dict, BackwardChoice]:
    """(examples/s, ms/step, setup s, plan, the embedding backward every rank ran) of one run."""
    q = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="rectrain-bench-") as tmp:
        mp.start_processes(run_rank, args=(run, tmp, q), nprocs=run.world_size, start_method="spawn")
        return q.get()


def last_number(output: str, prefix: str) -> float:
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    if not lines:
        raise RuntimeError(f"no line starting {prefix!r} in:\n{output}")
    return float(lines[-1].split()[-1])


def _stdout(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:  # the caller sees only the exit status; the reason is in the child's stderr
        print(done.stderr[-4000:], file=sys.stderr, flush=True)
        done.check_returncode()
    return done.stdout


def compare(a: argparse.Namespace) -> tuple[float, float | None]:
    """(TorchRec examples/s, compute bound examples/s or None off the CPU), each measured now."""
    reference = str(BENCH / "torchrec_reference.py")
    args = ["train", "--world-size", str(a.world_size), "--steps", str(a.steps)]
    standard_cpu = a.device == "cpu" and a.batch == B  # the only case compute_bound.py measures
    if not standard_cpu:
        args += ["--batch", str(a.batch), "--device", a.device]
    peer = _stdout([peer_python(a.peer_python), reference, *args])
    peer_s = last_number(peer, "torchrec train examples/s")
    if not standard_cpu:
        return peer_s, None
    bound = _stdout([sys.executable, str(BENCH / "compute_bound.py")])
    return peer_s, last_number(bound, "compute bound examples/s")


def measure(a: argparse.Namespace, repeat: int) -> tuple[float, float | None]:
    """One run of ours (with ``--pipeline``: plain then pipelined); prints and returns our figure."""
    modes = ["plain", "pipelined"] if a.pipeline else ["loop"]
    figures = {}
    for mode in modes:
        profile = a.profile if repeat == 0 and mode == modes[-1] else 0
        run = Run(a.world_size, a.steps, a.batch, a.device, mode, profile)
        examples_s, ms, setup_s, plan, kernel = run_ours(run)
        figures[mode] = examples_s
        if repeat == 0 and mode == modes[0]:
            print(f"plan: {plan}")
            print(f"embedding backward: {kernel.kernel} ({kernel.reason})", flush=True)
        label = "" if mode == "loop" else f" ({mode})"
        on = "" if a.device == "cpu" else f", {a.device}"
        print(
            f"rectrain train{label} {ms:.1f} ms/step, {examples_s:.0f} examples/s "
            f"(world size {a.world_size}, batch {a.batch}/rank{on}, setup {setup_s:.1f} s)"
        )
    return figures[modes[-1]], figures.get("plain")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=B, help=f"examples per rank (default {B})")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: rank r on GPU r, NCCL")
    ap.add_argument("--pipeline", action="store_true", help="time plain vs pipelined training pipelines")
    ap.add_argument("--compare", action="store_true", help="also run TorchRec and the compute bound")
    ap.add_argument(
        "--peer-python",
        metavar="PATH",
        help="interpreter that imports torchrec, for --compare (default $RECTRAIN_PEER_PYTHON, else the "
        "venv of scripts/torchrec_venv.sh)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="interleaved runs of each; figures are the best")
    ap.add_argument(
        "--profile", type=int, default=0, metavar="STEPS", help="profile rank 0 over STEPS extra steps"
    )
    a = ap.parse_args()
    if a.world_size < 1 or a.steps < 1 or a.repeats < 1 or a.batch < 1:
        ap.error("--world-size, --steps, --batch and --repeats must be >= 1")
    problem = check_gpus(a.device, a.world_size)
    if problem:
        ap.error(problem)
    return a


def main() -> None:
    a = parse_args()
    print_machine(a.device)
    ours, plains, peers, bounds = [], [], [], []
    for repeat in range(a.repeats):
        examples_s, plain_s = measure(a, repeat)
        ours.append(examples_s)
        plains.append(plain_s)
        if a.compare:
            peer, bound = compare(a)
            peers.append(peer)
            bounds.append(bound)
            bound_text = "" if bound is None else f", compute bound {bound:.0f}"
            print(f"  run {repeat}: rectrain {examples_s:.0f}, torchrec {peer:.0f}{bound_text} examples/s")
    ours_s = max(ours)
    if a.pipeline:
        plain_s = max(plains)
        print(f"rectrain train plain examples/s {plain_s:.0f}")
        print(f"rectrain train pipelined examples/s {ours_s:.0f}")
        print(f"ratio pipelined vs plain {ours_s / plain_s:.2f}")
    if a.compare:
        peer_s = max(peers)
        print(f"torchrec train examples/s {peer_s:.0f}")
        if bounds[0] is not None:
            bound_s = max(bounds)
            print(f"compute bound examples/s {bound_s:.0f}")
        print(f"ratio vs torchrec {ours_s / peer_s:.2f}")
        if a.world_size == 1 and bounds[0] is not None:
            print(f"fraction of compute bound {ours_s / bound_s:.2f}")
    print(f"rectrain train examples/s {ours_s:.0f}")


if __name__ == "__main__":
    main()
