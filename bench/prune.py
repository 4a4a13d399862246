"""Pruning at export on a Zipf-trafficked DLRM: package bytes, load time, capacity and held-out AUC of the
unpruned int8 package against pruned int8 ones.

A DLRM over ``--tables`` x ``--rows`` x ``--dim`` tables (full size: 4 x 2,000,000 x 128) is trained on one
rank (``DistributedModelParallel`` over a 1-rank gloo group, row-wise Adagrad) on examples whose ids follow a
Zipf law (exponent ``--zipf``, over a random permutation of each table's rows) and whose labels come from a
fixed teacher model, so the trained model has signal to lose. Training counts each row's lookups
(``train.row_counts``); the step time with counting on and off is timed on alternate blocks of steps (median
of each), and the counting of one batch's ids alone (its share of the step time is the steadier figure on a
busy machine). The
checkpoint is exported unpruned and with each ``--policies`` entry (int8), each gated on a held-out sample
of fresh teacher-labelled Zipf examples; per package: bytes on disk, ``Predictor.load`` time (sha256 checks
included; best of 3) and in-process capacity (examples/s scoring batches of ``--batch`` Zipf examples, one
thread; best of ``--repeats``).

    .venv/bin/python bench/prune.py [--rows 200000] [--steps 300] [--policies count:2,top:0.2,top:0.35]

Last lines, for the recommended policy (the smallest package whose AUC drop is within ``--max-auc-drop``):
``pruned / unpruned package bytes``, ``pruned auc drop``, ``pruned / unpruned load time``,
``pruned / unpruned capacity``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from machine import print_machine

from recserve.errors import AccuracyError
from recserve.export.accuracy import AccuracySample
from recserve.export.exporter import export_checkpoint
from recserve.export.prune import PrunePolicy
from recserve.export.sources import CheckpointSource
from recserve.runtime import Predictor, read_manifest
from rectrain import EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.checkpoint import save_checkpoint
from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.distributed.routing.input_dist import ShardInput
from rectrain.distributed.sharded.row_counts import track_row_counts
from rectrain.embedding import FusedOptimizerConfig
from rectrain.models import Batch, DLRMTrain, build_model
from rectrain.models.config import ModelConfig

DENSE = 13


class Traffic:
    """Zipf ids per table (a fixed random permutation of the rows by rank) and teacher labels."""

    def __init__(self, tables: int, rows: int, dim: int, exponent: float, ids_per_bag: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.tables, self.rows, self.ids_per_bag = tables, rows, ids_per_bag
        ranks = torch.arange(1, rows + 1, dtype=torch.float64)
        self.cdf = (ranks**-exponent).cumsum(0)
        self.cdf /= self.cdf[-1].clone()
        self.permutation = [torch.randperm(rows, generator=gen) for _ in range(tables)]
        self.teacher = [torch.randn(rows, generator=gen) * 0.7 for _ in range(tables)]
        self.dense_weight = torch.randn(DENSE, generator=gen) * 0.3

    def batch(self, size: int, seed: int) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        n = size * self.ids_per_bag
        ids = [p[torch.searchsorted(self.cdf, torch.rand(n, generator=gen, dtype=torch.float64))]
               for p in self.permutation]  # fmt: skip
        ids = [i.clamp_max(self.rows - 1) for i in ids]
        lengths = torch.full((self.tables * size,), self.ids_per_bag)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{t}" for t in range(self.tables)],
                                                  values=torch.cat(ids), lengths=lengths)  # fmt: skip
        dense = torch.randn(size, DENSE, generator=gen)
        logit = dense @ self.dense_weight
        for t in range(self.tables):
            logit += self.teacher[t][ids[t]].view(size, -1).sum(1) / self.ids_per_bag**0.5
        labels = torch.bernoulli(torch.sigmoid(logit), generator=gen)
        return dense, kjt, labels


def model_config(args: argparse.Namespace) -> ModelConfig:
    tables = [
        EmbeddingBagConfig(
            name=f"t{t}", num_embeddings=args.rows, embedding_dim=args.dim, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]
    return ModelConfig(kind="dlrm", tables=tables, dense_in_features=DENSE,
                       dense_arch_layer_sizes=[64, args.dim], over_arch_layer_sizes=[64, 1])  # fmt: skip


def train(args: argparse.Namespace, cfg: ModelConfig, traffic: Traffic, root: Path) -> dict[str, float]:
    """Train with counting on alternate blocks of steps; save the checkpoint; the step times."""
    store = dist.FileStore(str(root / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    fused = FusedOptimizerConfig("rowwise_adagrad", lr=0.05)
    prediction = build_model(cfg, fused_optimizer=fused, embedding_device="meta")
    model = DistributedModelParallel(DLRMTrain(prediction), env=env, device="cpu")
    dense_opt = torch.optim.Adagrad([p for p in model.parameters() if p.requires_grad], lr=0.02)
    track_row_counts(model)
    collection = next(m for m in model.modules() if hasattr(m, "row_counts"))
    counter, times = collection.row_counts, {"on": [], "off": []}
    block = max(1, args.steps // 10)
    for step in range(args.steps):
        counting = (step // block) % 2 == 0
        collection.row_counts = counter if counting else None
        dense, kjt, labels = traffic.batch(args.batch, seed=step)
        started = time.perf_counter()
        loss, _ = model(Batch(dense, kjt, labels))
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        times["on" if counting else "off"].append(time.perf_counter() - started)
    collection.row_counts = counter
    times["count"] = [_count_time(counter, traffic, args) for _ in range(5)]
    save_checkpoint(root / "ckpt", model=model, step=args.steps, model_config=cfg, env=env)
    dist.destroy_process_group()
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def _count_time(counter, traffic: Traffic, args: argparse.Namespace) -> float:
    """Seconds ``RowCounts.observe`` takes for one batch's routed ids (what counting adds to a step)."""
    _, kjt, _ = traffic.batch(args.batch, seed=7)
    shard_input = ShardInput(kjt.values(), kjt.offsets(), None, [args.batch])
    started = time.perf_counter()
    counter.observe(shard_input)
    return time.perf_counter() - started


def measure(path: Path, traffic: Traffic, args: argparse.Namespace) -> dict[str, float]:
    files = sum(p.stat().st_size for p in path.iterdir())
    load = min(_timed(lambda: Predictor.load(path)) for _ in range(3))
    predictor = Predictor.load(path)
    batches = [traffic.batch(args.batch, seed=10**6 + i)[:2] for i in range(8)]
    best = 0.0
    for _ in range(args.repeats):
        started = time.perf_counter()
        for dense, kjt in batches:
            predictor.predict(dense, kjt)
        best = max(best, len(batches) * args.batch / (time.perf_counter() - started))
    return {"bytes": files, "load": load, "capacity": best}


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--rows", type=int, default=200_000, help="rows per table (full size: 2,000,000)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--zipf", type=float, default=1.05)
    parser.add_argument("--ids-per-bag", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--heldout", type=int, default=16384, help="held-out examples for the gate")
    parser.add_argument("--policies", default="count:2,top:0.2,top:0.3")
    parser.add_argument("--default", default="mean", choices=["zero", "mean"])
    parser.add_argument("--max-auc-drop", type=float, default=0.002)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_machine()
    shape = f"{args.tables} x {args.rows:,} x {args.dim}"
    print(
        f"model: {shape}, zipf {args.zipf}, {args.ids_per_bag} ids per bag; {args.steps} steps x {args.batch}"
    )
    cfg, traffic = model_config(args), Traffic(args.tables, args.rows, args.dim, args.zipf, args.ids_per_bag)
    dense, kjt, labels = traffic.batch(args.heldout, seed=-1 % 2**31)
    heldout = AccuracySample(dense, kjt, labels)
    with tempfile.TemporaryDirectory(prefix="bench-prune-") as tmp:
        root = Path(tmp)
        step = train(args, cfg, traffic, root)
        print(f"step time {step['off'] * 1e3:.1f} ms; counting one batch's ids {step['count'] * 1e3:.3f} ms")
        print(f"row counts share of step time {step['count'] / step['off']:.4f}")
        print(f"row counts step time overhead {step['on'] / step['off'] - 1:.4f}")
        results = {}
        for policy in ["none", *args.policies.split(",")]:
            prune = None if policy == "none" else PrunePolicy.parse(policy, args.default)
            try:
                with CheckpointSource(root / "ckpt") as source:
                    out = root / policy.replace(":", "_")
                    path = export_checkpoint(
                        out, cfg, source, accuracy_sample=heldout, prune=prune, max_auc_drop=1
                    )
            except AccuracyError as error:
                print(f"{policy}: {error}")
                continue
            manifest = read_manifest(path)
            figures = measure(path, traffic, args)
            figures["auc_drop"] = -manifest.accuracy["package"]["auc_diff"]
            kept = sum(t["kept"] for t in (manifest.pruning or {"tables": {}})["tables"].values())
            results[policy] = figures
            print(
                f"{policy:<10} {figures['bytes'] / 2**20:9.1f} MiB  load {figures['load']:.3f} s  capacity "
                f"{figures['capacity']:,.0f}/s  auc drop {figures['auc_drop']:+.5f}  rows kept {kept:,}"
            )
    base = results["none"]
    for policy, figures in results.items():
        if policy != "none":
            print(f"{policy} pruned / unpruned package bytes {figures['bytes'] / base['bytes']:.4f}")
            print(f"{policy} pruned auc drop {figures['auc_drop']:.5f}")
    within = [p for p in results if p != "none" and results[p]["auc_drop"] <= args.max_auc_drop]
    if not within:
        print(f"no policy within max auc drop {args.max_auc_drop}")
        return
    best = min(within, key=lambda p: results[p]["bytes"])
    chosen = results[best]
    print(f"recommended policy {best} ({args.default} default; {args.tables} x {args.rows:,} x {args.dim})")
    print(f"pruned / unpruned package bytes {chosen['bytes'] / base['bytes']:.4f}")
    print(f"pruned auc drop {chosen['auc_drop']:.5f}")
    print(f"pruned / unpruned load time {chosen['load'] / base['load']:.4f}")
    print(f"pruned / unpruned capacity {chosen['capacity'] / base['capacity']:.4f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
