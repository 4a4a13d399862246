"""Training throughput of our DLRM under DistributedModelParallel on the standard workload (WORKLOAD.md).

Mirrors bench/torchrec_reference.py (train) step for step: the same batches (a generator seeded
``1000 * rank + step``, 4 cached per rank), 3 warm-up steps, then ``--steps`` timed steps between barriers;
gloo, one spawned process per rank, ``cores // world_size`` threads each. Ranks meet through a FileStore in a
temp dir (no port). The planner picks the plan; tables use fused row-wise Adagrad (lr 0.05), the dense part
Adagrad (lr 0.05).

    .venv/bin/python bench/train_throughput.py --world-size 1|2 [--steps 20] [--pipeline] [--compare]
        [--profile STEPS] [--repeats N]

``--pipeline`` times the training pipelines on the same model and batches: ``TrainPipelineBase`` (the plain
loop: load, forward, backward, step) against ``TrainPipelineSparseDist`` (the next batch's input all-to-all
in flight during this batch's compute), and prints both and their ratio; the last line is then the pipelined
figure. Without it the step is the hand-written loop the TorchRec script runs.
``--repeats N`` alternates N runs of each and reports each one's best run: on a shared machine other load only
ever slows a run down, so the fastest is the least disturbed.
``--compare`` also runs the TorchRec reference (bench/torchrec_reference.py, in its own venv built by
scripts/torchrec_venv.sh on first use) and the compute bound (compute_bound.py), prints them and the
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
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import print_machine
from torchrec_reference import venv_python

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig, KeyedJaggedTensor
from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.embedding.native_backward import auto_choice
from rectrain.models import DLRM, Batch, DLRMTrain
from rectrain.train import TrainPipelineBase, TrainPipelineSparseDist

T, E, D, DENSE, B, L = 8, 100_000, 64, 13, 2048, 20
LR = 0.05
BENCH = Path(__file__).resolve().parent


def make_batch(rank: int, step: int) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """The peer script's batch for (rank, step), draw for draw."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    lengths = torch.randint(1, 2 * L, (T * B,), generator=g)
    values = torch.randint(0, E, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(T)], values=values, lengths=lengths
    )
    dense = torch.randn(B, DENSE, generator=g)
    labels = torch.randint(0, 2, (B,), generator=g).float()
    return dense, kjt, labels


def build(
    env: ShardingEnv, train_wrapper: bool = False
) -> tuple[DistributedModelParallel, torch.optim.Optimizer]:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=D, num_embeddings=E, feature_names=[f"f{i}"])
        for i in range(T)
    ]
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
    dmp = DistributedModelParallel(model, env=env, device=torch.device("cpu"), batch_size=B)
    opt = torch.optim.Adagrad([p for n, p in dmp.named_parameters() if "sparse_arch" not in n], lr=LR)
    return dmp, opt


def profile_rank(step: Callable[[int], None], steps: int, rank: int) -> None:
    """Run ``steps`` more steps on every rank; rank 0 prints where its time goes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
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
    dmp: DistributedModelParallel, opt: torch.optim.Optimizer, rank: int
) -> Callable[[int], None]:
    """The TorchRec script's loop body over 4 cached batches."""
    lossf = torch.nn.BCEWithLogitsLoss()
    data = [make_batch(rank, s) for s in range(4)]

    def step(i: int) -> None:
        dense, kjt, labels = data[i % 4]
        logits = dmp(dense, kjt).squeeze(-1)
        loss = lossf(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def pipeline_step(
    dmp: DistributedModelParallel, opt: torch.optim.Optimizer, rank: int, pipelined: bool
) -> Callable[[int], None]:
    """One ``progress()`` of a training pipeline per call, over the same 4 cached batches, endlessly."""
    data = [Batch(*make_batch(rank, s)) for s in range(4)]
    batches = (data[i % 4] for i in itertools.count())
    pipeline_type = TrainPipelineSparseDist if pipelined else TrainPipelineBase
    pipeline = pipeline_type(dmp, opt, torch.device("cpu"))
    return lambda i: pipeline.progress(batches)


def run_rank(rank: int, ws: int, steps: int, store_dir: str, profile_steps: int, mode: str, out) -> None:
    store = dist.FileStore(os.path.join(store_dir, "store"), ws)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=ws)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ws))
    t0 = time.perf_counter()
    dmp, opt = build(ShardingEnv.from_process_group(dist.group.WORLD), train_wrapper=mode != "loop")
    setup_s = time.perf_counter() - t0
    if mode == "loop":
        step = hand_written_step(dmp, opt, rank)
    else:
        step = pipeline_step(dmp, opt, rank, pipelined=mode == "pipelined")

    for i in range(3):
        step(i)
    dist.barrier()
    t = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    dt = time.perf_counter() - t
    if rank == 0:
        path = next(iter(dmp.plan.plan))
        plan = {name: s.sharding_type.value for name, s in dmp.plan.get_plan_for_module(path).items()}
        out.put((ws * B * steps / dt, 1e3 * dt / steps, setup_s, plan))
    if profile_steps:
        profile_rank(step, profile_steps, rank)
    dist.destroy_process_group()


def run_ours(ws: int, steps: int, profile_steps: int, mode: str = "loop") -> tuple[float, float, float, dict]:
    """(examples/s, ms/step, setup s, plan) of ``mode``: "loop" (hand-written), "plain" or "pipelined"."""
    q = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="rectrain-bench-") as tmp:
        args = (ws, steps, tmp, profile_steps, mode, q)
        mp.start_processes(run_rank, args=args, nprocs=ws, start_method="spawn")
        return q.get()


def last_number(output: str, prefix: str) -> float:
    lines = [line for line in output.splitlines() if line.startswith(prefix)]
    if not lines:
        raise RuntimeError(f"no line starting {prefix!r} in:\n{output}")
    return float(lines[-1].split()[-1])


def _stdout(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def compare(ws: int, steps: int) -> tuple[float, float]:
    """(TorchRec examples/s at this world size, compute bound examples/s), each measured now."""
    reference = str(BENCH / "torchrec_reference.py")
    peer = _stdout([venv_python(), reference, "train", "--world-size", str(ws), "--steps", str(steps)])
    bound = _stdout([sys.executable, str(BENCH / "compute_bound.py")])
    return last_number(peer, "torchrec train examples/s"), last_number(bound, "compute bound examples/s")


def measure(a: argparse.Namespace, repeat: int) -> tuple[float, float | None]:
    """One run of ours (with ``--pipeline``: plain then pipelined); prints and returns our figure."""
    modes = ["plain", "pipelined"] if a.pipeline else ["loop"]
    figures = {}
    for mode in modes:
        profile = a.profile if repeat == 0 and mode == modes[-1] else 0
        examples_s, ms, setup_s, plan = run_ours(a.world_size, a.steps, profile, mode)
        figures[mode] = examples_s
        if repeat == 0 and mode == modes[0]:
            print(f"plan: {plan}")
        label = "" if mode == "loop" else f" ({mode})"
        print(
            f"rectrain train{label} {ms:.1f} ms/step, {examples_s:.0f} examples/s "
            f"(world size {a.world_size}, batch {B}/rank, setup {setup_s:.1f} s)"
        )
    return figures[modes[-1]], figures.get("plain")


def main() -> None:
    print_machine()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--pipeline", action="store_true", help="time plain vs pipelined training pipelines")
    ap.add_argument("--compare", action="store_true", help="also run TorchRec and the compute bound")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved runs of each; figures are the best")
    ap.add_argument(
        "--profile", type=int, default=0, metavar="STEPS", help="profile rank 0 over STEPS extra steps"
    )
    a = ap.parse_args()
    if a.world_size < 1 or a.steps < 1 or a.repeats < 1:
        ap.error("--world-size, --steps and --repeats must be >= 1")
    print(f"CPU embedding backward (auto): {auto_choice()}", flush=True)
    ours, plains, peers, bounds = [], [], [], []
    for repeat in range(a.repeats):
        examples_s, plain_s = measure(a, repeat)
        ours.append(examples_s)
        plains.append(plain_s)
        if a.compare:
            peer, bound = compare(a.world_size, a.steps)
            peers.append(peer)
            bounds.append(bound)
            print(
                f"  run {repeat}: rectrain {examples_s:.0f}, torchrec {peer:.0f}, "
                f"compute bound {bound:.0f} examples/s"
            )
    ours_s = max(ours)
    if a.pipeline:
        plain_s = max(plains)
        print(f"rectrain train plain examples/s {plain_s:.0f}")
        print(f"rectrain train pipelined examples/s {ours_s:.0f}")
        print(f"ratio pipelined vs plain {ours_s / plain_s:.2f}")
    if a.compare:
        peer_s, bound_s = max(peers), max(bounds)
        print(f"torchrec train examples/s {peer_s:.0f}")
        print(f"compute bound examples/s {bound_s:.0f}")
        print(f"ratio vs torchrec {ours_s / peer_s:.2f}")
        if a.world_size == 1:
            print(f"fraction of compute bound {ours_s / bound_s:.2f}")
    print(f"rectrain train examples/s {ours_s:.0f}")


if __name__ == "__main__":
    main()
