"""The TorchRec reference the benchmarks compare against, run in TorchRec's own venv.

``train``: TorchRec 1.8.0's DLRM on the standard workload (bench/WORKLOAD.md: 8 x 100k x 64 tables, 13 dense
features, batch 2048, 1..39 ids per bag), tables sharded by TorchRec's planner over gloo with fused row-wise
Adagrad (lr 0.05), dense Adagrad; warm-up 3 steps, then ``--steps`` timed. Last line:
``torchrec train examples/s N`` (global). ``infer``: TorchRec's int8-quantized DLRM forward in-process; last
line ``torchrec int8 infer examples/s N``.

    bash scripts/torchrec_venv.sh            # prints the venv (builds it on first use)
    $VENV/bin/python bench/torchrec_reference.py train --world-size 1|2 [--steps 20]
    $VENV/bin/python bench/torchrec_reference.py infer [--batch 512] [--iters 50]

bench/train_throughput.py --compare and bench/infer_throughput.py run it themselves (see :func:`venv_python`).
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import time
from pathlib import Path

TABLES, ROWS, DIM, DENSE, BATCH, MEAN_LEN, LR = 8, 100_000, 64, 13, 2048, 20, 0.05
REPO = Path(__file__).resolve().parent.parent


def venv_python() -> str:
    """The TorchRec venv's python, built by scripts/torchrec_venv.sh on first use (minutes)."""
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "torchrec_venv.sh")], check=True, capture_output=True, text=True
    )
    return f"{out.stdout.strip().splitlines()[-1]}/bin/python"


def _tables():
    from torchrec import EmbeddingBagConfig

    return [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f{i}"])
        for i in range(TABLES)
    ]


def _model(ebc):
    from torchrec.models.dlrm import DLRM

    return DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[512, 256, DIM],
        over_arch_layer_sizes=[512, 256, 1],
    )


def _batch(seed: int, batch: int):
    import torch
    from torchrec import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 2 * MEAN_LEN, (TABLES * batch,), generator=gen)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen)
    keys = [f"f{i}" for i in range(TABLES)]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    return torch.randn(batch, DENSE, generator=gen), kjt, torch.randint(0, 2, (batch,), generator=gen).float()


def _train_rank(rank: int, world_size: int, steps: int, out) -> None:
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("TORCHREC_REF_PORT", "29517"))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    model = _model(EmbeddingBagCollection(tables=_tables(), device=torch.device("meta")))
    apply_optimizer_in_backward(torch.optim.Adagrad, model.sparse_arch.parameters(), {"lr": LR})
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR}
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"))
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    dense_params = [p for name, p in dmp.named_parameters() if "sparse_arch" not in name]
    optimizer = torch.optim.Adagrad(dense_params, lr=LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    data = [_batch(1000 * rank + s, BATCH) for s in range(4)]

    def step(i: int) -> None:
        dense, kjt, labels = data[i % len(data)]
        loss = loss_fn(dmp(dense, kjt).squeeze(-1), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for i in range(3):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    if rank == 0:
        out.put(world_size * BATCH * steps / (time.perf_counter() - start))
    dist.destroy_process_group()


def train(world_size: int, steps: int) -> float:
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_train_rank, args=(world_size, steps, queue), nprocs=world_size, start_method="spawn")
    return queue.get()


def infer(batch: int, iters: int) -> float:
    import torch
    from torchrec import EmbeddingBagCollection
    from torchrec.inference.modules import quantize_inference_model

    model = _model(EmbeddingBagCollection(tables=_tables())).eval()
    quantized = quantize_inference_model(copy.deepcopy(model), output_dtype=torch.float32)
    dense, kjt, _ = _batch(0, batch)
    with torch.inference_mode():
        print("max |int8 - fp32| logit diff", (quantized(dense, kjt) - model(dense, kjt)).abs().max().item())
        for _ in range(5):
            quantized(dense, kjt)
        start = time.perf_counter()
        for _ in range(iters):
            quantized(dense, kjt)
    return batch * iters / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    train_args = sub.add_parser("train")
    train_args.add_argument("--world-size", type=int, default=1)
    train_args.add_argument("--steps", type=int, default=20)
    infer_args = sub.add_parser("infer")
    infer_args.add_argument("--batch", type=int, default=512)
    infer_args.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    if args.mode == "train":
        print(f"torchrec train examples/s {train(args.world_size, args.steps):.0f}")
    else:
        print(f"torchrec int8 infer examples/s {infer(args.batch, args.iters):.0f}")


if __name__ == "__main__":
    main()
