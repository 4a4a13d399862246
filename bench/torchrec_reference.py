"""The TorchRec reference the benchmarks compare against, run in TorchRec's own venv.

``train``: TorchRec 1.8.0's DLRM on the standard workload (docs/benchmarks.md: 8 x 100k x 64 tables, 13 dense
features, batch 2048, 1..39 ids per bag), tables sharded by TorchRec's planner with fused row-wise Adagrad
(lr 0.05), dense Adagrad; warm-up 3 steps, then ``--steps`` timed. Last line: ``torchrec train examples/s N``
(global). ``infer``: TorchRec's int8-quantized DLRM forward in-process; last line
``torchrec int8 infer examples/s N``.

``--device cuda`` runs one process per GPU over NCCL (``train``) or the quantized model on GPU 0 (``infer``,
timed from a CPU request to CPU scores, as ``Predictor.predict`` is); batches are drawn on the CPU as on cpu,
then copied. The default, ``cpu``, is gloo with ``cores // world size`` threads per rank.

    bash scripts/torchrec_venv.sh            # prints the venv (builds it on first use)
    $VENV/bin/python bench/torchrec_reference.py train --world-size 1|2 [--steps 20] [--batch 2048]
        [--device cpu|cuda]
    $VENV/bin/python bench/torchrec_reference.py infer [--batch 512] [--iters 50] [--device cpu|cuda]

bench/train_throughput.py --compare and bench/infer_throughput.py run it themselves with
:func:`peer_python`: ``--peer-python`` or ``$RECTRAIN_PEER_PYTHON`` when given (any interpreter that imports
torchrec, e.g. the one running the benchmark), else the venv of scripts/torchrec_venv.sh.
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
PEER_PYTHON_ENV = "RECTRAIN_PEER_PYTHON"


def peer_python(explicit: str | None = None) -> str:
    """The interpreter that runs this script for a benchmark: ``explicit``, else ``$RECTRAIN_PEER_PYTHON``,
    else the TorchRec venv's (built on first use). A machine without internet has no venv to build, but may
    have torchrec importable next to the project: name that interpreter there."""
    return explicit or os.environ.get(PEER_PYTHON_ENV) or venv_python()


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


def _rank_device(device_type: str, rank: int):
    """This rank's device; on cuda also the current device, which NCCL and TorchRec's sharding rely on."""
    import torch

    if device_type == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _synchronize(device) -> None:
    """Wait for the GPU's queued work, so that a clock read after it counts that work."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_rank(rank: int, world_size: int, steps: int, batch: int, device_type: str, out) -> None:
    import torch
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("TORCHREC_REF_PORT", "29517"))
    device = _rank_device(device_type, rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    model = _model(EmbeddingBagCollection(tables=_tables(), device=torch.device("meta")))
    apply_optimizer_in_backward(torch.optim.Adagrad, model.sparse_arch.parameters(), {"lr": LR})
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": LR}
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device=device.type))
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=[sharder])
    dense_params = [p for name, p in dmp.named_parameters() if "sparse_arch" not in name]
    optimizer = torch.optim.Adagrad(dense_params, lr=LR)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    data = [_to(_batch(1000 * rank + s, batch), device) for s in range(4)]

    def step(i: int) -> None:
        dense, kjt, labels = data[i % len(data)]
        loss = loss_fn(dmp(dense, kjt).squeeze(-1), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for i in range(3):
        step(i)
    dist.barrier()
    _synchronize(device)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    _synchronize(device)
    if rank == 0:
        out.put(world_size * batch * steps / (time.perf_counter() - start))
    dist.destroy_process_group()


def _to(batch: tuple, device) -> tuple:
    """(dense, kjt, labels) on ``device``; on cpu the very same objects, as before there was a device."""
    return batch if device.type == "cpu" else tuple(part.to(device) for part in batch)


def check_gpus(device_type: str, world_size: int) -> str | None:
    """Why ``world_size`` ranks cannot run on ``device_type`` here (one GPU per rank), or None if they can."""
    import torch

    if device_type != "cuda":
        return None
    if not torch.cuda.is_available():
        return "--device cuda: torch sees no CUDA device here"
    if world_size > torch.cuda.device_count():
        return f"--world-size {world_size} needs one GPU per rank; {torch.cuda.device_count()} visible"
    return None


def train(world_size: int, steps: int, batch: int = BATCH, device_type: str = "cpu") -> float:
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    args = (world_size, steps, batch, device_type, queue)
    mp.start_processes(_train_rank, args=args, nprocs=world_size, start_method="spawn")
    return queue.get()


def infer(batch: int, iters: int, device_type: str = "cpu") -> float:
    import torch
    from torchrec import EmbeddingBagCollection
    from torchrec.inference.modules import quantize_inference_model

    device = torch.device(device_type)
    # The quantized tables go where the float weights are, so the float model is built on the device.
    model = _model(EmbeddingBagCollection(tables=_tables(), device=device)).to(device).eval()
    quantized = quantize_inference_model(copy.deepcopy(model), output_dtype=torch.float32)
    dense, kjt, _ = _batch(0, batch)

    def run() -> None:
        if device.type == "cuda":  # a request arrives on the CPU and its scores leave on the CPU
            quantized(dense.to(device), kjt.to(device)).cpu()
        else:
            quantized(dense, kjt)

    with torch.inference_mode():
        on = _to((dense, kjt), device)
        print("max |int8 - fp32| logit diff", (quantized(*on) - model(*on)).abs().max().item())
        for _ in range(5):
            run()
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            run()
        _synchronize(device)
    return batch * iters / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    train_args = sub.add_parser("train")
    train_args.add_argument("--world-size", type=int, default=1)
    train_args.add_argument("--steps", type=int, default=20)
    train_args.add_argument("--batch", type=int, default=BATCH, help="examples per rank")
    infer_args = sub.add_parser("infer")
    infer_args.add_argument("--batch", type=int, default=512)
    infer_args.add_argument("--iters", type=int, default=50)
    for mode_args in (train_args, infer_args):
        mode_args.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    problem = check_gpus(args.device, getattr(args, "world_size", 1))
    if problem:
        parser.error(problem)
    if args.mode == "train":
        examples_s = train(args.world_size, args.steps, args.batch, args.device)
        print(f"torchrec train examples/s {examples_s:.0f}")
    else:
        print(f"torchrec int8 infer examples/s {infer(args.batch, args.iters, args.device):.0f}")


if __name__ == "__main__":
    main()
