"""Checkpoint save/load time and MB/s on the standard workload's tables, against plain torch.save/torch.load.

The model is the standard workload's DLRM (8 tables x 100,000 rows x 64 dims, fp32, fused row-wise Adagrad;
dense Adagrad) under DistributedModelParallel with the planner's plan, on 1 or 2 gloo ranks (spawned,
FileStore rendezvous). Each figure is the best of ``--repeats`` runs, timed between barriers (slowest rank):

- ``save``: ``save_checkpoint`` (every rank writes its shards, fsync, sha256, manifest, rename, ``latest``);
- ``async``: how long ``save_checkpoint_async`` blocks training (the host-memory snapshot);
- ``load``: ``load_checkpoint`` with checksum verification into a freshly built model;
- baseline: each rank ``torch.save``s the same tensors (its shards, their momentum, dense state and dense
  optimizer state) to one file and ``torch.load``s it (``weights_only=True``) — no fsync, no checksum.

MB/s is checkpoint bytes (all files) / seconds. Ratios are ours / torch (lower is better).

    .venv/bin/python bench/checkpoint_io.py [--world-size 1 2] [--repeats 3] [--dir /tmp/...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from machine import print_machine

from rectrain import CombinedOptimizer, EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.checkpoint import load_checkpoint, save_checkpoint, save_checkpoint_async
from rectrain.checkpoint.model_state import dense_state, local_tables
from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.models import DLRM

T, E, D, DENSE = 8, 100_000, 64, 13


def build(env: ShardingEnv) -> tuple[DistributedModelParallel, CombinedOptimizer]:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=E, embedding_dim=D, feature_names=[f"f{i}"])
        for i in range(T)
    ]
    ebc = EmbeddingBagCollection(tables, fused_optimizer=FusedOptimizerConfig("rowwise_adagrad", lr=0.05))
    model = DistributedModelParallel(DLRM(ebc, DENSE, [512, 256, D], [512, 256, 1]), env=env, device="cpu")
    dense = torch.optim.Adagrad([p for _, p in model.named_parameters() if p.requires_grad], lr=0.05)
    return model, CombinedOptimizer([("dense", dense), ("sparse", model.fused_optimizer)])


def plain_state(model: DistributedModelParallel, optimizer: CombinedOptimizer, rank: int) -> dict:
    """The same tensors a checkpoint holds on this rank, as one dict for torch.save."""
    state = {}
    for key, table in local_tables(model).items():
        if table.replicated and rank:
            continue
        for i, piece in enumerate(table.pieces):
            state[f"{key}/{i}"] = piece.weight
            state.update({f"{key}/{i}/{n}": s for n, s in piece.states.items()})
    if rank == 0:
        state.update(dense_state(model))
        state["optim"] = optimizer.state_dict()["dense"]
    return state


def timed(env: ShardingEnv, fn: Callable[[], object]) -> float:
    """Seconds of ``fn`` on the slowest rank."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    seconds = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return float(seconds)


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_rank(rank: int, world_size: int, store_dir: str, out_dir: str, repeats: int, results: dict) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    store = dist.FileStore(os.path.join(store_dir, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    model, optimizer = build(env)
    root, plain = Path(out_dir) / "ckpt", Path(out_dir) / f"plain_{rank}.pt"
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    for step in range(repeats):
        keep(
            "save",
            timed(
                env,
                lambda s=step: save_checkpoint(root, model=model, optimizer=optimizer, step=s, keep_last=1),
            ),
        )
        handle = None

        def start_async(s: int = step) -> None:
            nonlocal handle
            handle = save_checkpoint_async(root, model=model, optimizer=optimizer, step=100 + s, keep_last=1)

        keep("async", timed(env, start_async))
        handle.wait()
        fresh, fresh_optimizer = build(env)
        keep(
            "load", timed(env, lambda m=fresh, o=fresh_optimizer: load_checkpoint(root, model=m, optimizer=o))
        )
        state = plain_state(model, optimizer, rank)
        keep("torch.save", timed(env, lambda s=state: torch.save(s, plain)))
        keep("torch.load", timed(env, lambda: torch.load(plain, weights_only=True)))
    dist.barrier()
    if rank == 0:
        step_dir = root / (root / "latest").read_text().strip()
        results.update(best, ckpt_bytes=_bytes(step_dir))
        results["plain_bytes"] = sum(p.stat().st_size for p in Path(out_dir).glob("plain_*.pt"))
    dist.barrier()
    dist.destroy_process_group()


def bench(world_size: int, repeats: int, base: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-", dir=base) as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(
            run_rank, (world_size, tmp, tmp, repeats, results), nprocs=world_size, start_method="spawn"
        )
        out = dict(results)
        shutil.rmtree(tmp, ignore_errors=True)
        return out


def main() -> None:
    print_machine()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
    args = parser.parse_args()
    for world_size in args.world_size:
        r = bench(world_size, args.repeats, args.dir)
        mb, plain_mb = r["ckpt_bytes"] / 1e6, r["plain_bytes"] / 1e6
        print(f"world size {world_size}: checkpoint {mb:.0f} MB (torch.save files {plain_mb:.0f} MB)")
        for ours, theirs in (("save", "torch.save"), ("load", "torch.load")):
            print(
                f"  {ours:<5} {r[ours]:6.2f} s {mb / r[ours]:7.0f} MB/s | {theirs} {r[theirs]:6.2f} s "
                f"{plain_mb / r[theirs]:7.0f} MB/s | ratio {r[ours] / r[theirs]:.2f}x"
            )
        print(
            f"  async save blocks training for {r['async']:.2f} s (host snapshot), then writes in background"
        )


if __name__ == "__main__":
    main()
