"""EmbeddingBagCollection forward+backward (fused row-wise Adagrad) vs raw FBGEMM TBE and nn.EmbeddingBag.

``rectrain ebc`` runs the backward ``auto`` picks on this machine (printed, with why); ``ebc native bwd``
(our compiled backward, rectrain.embedding.cpu_kernel) and ``ebc fbgemm bwd`` force either kernel
(rectrain.embedding.backward_choice). All variants run FBGEMM's forward.
The standard workload's tables (docs/benchmarks.md): 8 tables x 100,000 rows x 64 dims, one feature each,
1..39 ids per example per feature, batch 2048, lr 0.05. Each timed step runs the variants back to back in a
seeded random order on the same pre-built batch, so machine noise hits them alike; the figure per variant
is the median over the timed steps. The raw TBE is built with the same arguments our collection passes to
FBGEMM, so the ratio measures the collection's own overhead (input routing, output wrapping).

    .venv/bin/python bench/embedding_bag.py [--batch-size 2048] [--steps 20] [--device cpu|cuda]

``--device cuda`` runs every variant on GPU 0 (tables, batch and gradient there; each clock read waits for
the GPU) and leaves out the two forced-backward variants, which are CPU kernels.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)
from machine import print_machine
from torch import Tensor, nn

from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.backward_choice import auto_choice
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.sparse import KeyedJaggedTensor

LR = 0.05


def make_batch(args: argparse.Namespace, gen: torch.Generator) -> KeyedJaggedTensor:
    keys = [f"f{i}" for i in range(args.tables)]
    lengths = torch.randint(1, 40, (args.tables * args.batch_size,), generator=gen)
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen)
    kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
    return kjt if args.device == "cpu" else kjt.to(torch.device(args.device))


def synchronize(device: str) -> None:
    """Wait for queued GPU work, so that a clock read after it counts that work."""
    if device == "cuda":
        torch.cuda.synchronize()


def ours(args: argparse.Namespace, cpu_backward: str = "auto") -> Callable[[KeyedJaggedTensor, Tensor], None]:
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", num_embeddings=args.rows, embedding_dim=args.dim, feature_names=[f"f{i}"]
        )
        for i in range(args.tables)
    ]
    ebc = EmbeddingBagCollection(
        tables,
        device=args.device,
        fused_optimizer=FusedOptimizerConfig("rowwise_adagrad", lr=LR, cpu_backward=cpu_backward),
    )

    def step(kjt: KeyedJaggedTensor, grad: Tensor) -> None:
        ebc(kjt).values().backward(grad)

    return step


def raw_fbgemm(args: argparse.Namespace) -> Callable[[KeyedJaggedTensor, Tensor], None]:
    """The TBE our collection builds (rectrain.embedding.table_batch), called directly."""
    cpu = args.device == "cpu"
    location, compute = (
        (EmbeddingLocation.HOST, ComputeDevice.CPU) if cpu else (EmbeddingLocation.DEVICE, ComputeDevice.CUDA)
    )
    spec = (args.rows, args.dim, location, compute)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [spec] * args.tables,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=LR,
        eps=1e-8,
        weight_decay_mode=WeightDecayMode.NONE,
        pooling_mode=PoolingMode.SUM,
        device=torch.device(args.device),
        bounds_check_mode=BoundsCheckMode.FATAL if cpu else BoundsCheckMode.WARNING,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
    )

    def step(kjt: KeyedJaggedTensor, grad: Tensor) -> None:
        tbe(kjt.values(), kjt.offsets()).backward(grad)

    return step


def embedding_bags(args: argparse.Namespace) -> Callable[[KeyedJaggedTensor, Tensor], None]:
    bags = nn.ModuleList(
        nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=True) for _ in range(args.tables)
    ).to(args.device)
    optimizer = torch.optim.Adagrad(bags.parameters(), lr=LR)

    def step(kjt: KeyedJaggedTensor, grad: Tensor) -> None:
        features = kjt.to_dict()
        pooled = [bag(jagged.values(), jagged.offsets()[:-1]) for bag, jagged in zip(bags, features.values())]
        optimizer.zero_grad()
        torch.cat(pooled, dim=1).backward(grad)
        optimizer.step()

    return step


def time_variants(
    variants: dict[str, Callable[[KeyedJaggedTensor, Tensor], None]], args: argparse.Namespace
) -> dict[str, float]:
    """Median ms/step of each variant; variants alternate within every step, in a seeded random order.

    Not a rotation: under rotation a variant always follows the same one, and a variant run just after an
    OpenMP one (FBGEMM's step, nn.EmbeddingBag's) shares the cores with its still-spinning threads (measured:
    the compiled-kernel variant took 124 ms after another compiled one, 190 ms after nn.EmbeddingBag)."""
    gen = torch.Generator().manual_seed(0)
    batches = [make_batch(args, gen) for _ in range(4)]
    grad = torch.randn(args.batch_size, args.tables * args.dim, generator=gen).to(args.device)
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    shuffle = random.Random(0).shuffle
    for step in range(args.warmup + args.steps):
        kjt = batches[step % len(batches)]
        order = list(names)
        shuffle(order)
        for name in order:
            synchronize(args.device)
            start = time.perf_counter()
            variants[name](kjt, grad)
            synchronize(args.device)
            elapsed = (time.perf_counter() - start) * 1e3
            if step >= args.warmup:
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    return args


def variants_for(args: argparse.Namespace) -> dict[str, Callable[[KeyedJaggedTensor, Tensor], None]]:
    """Every variant that runs on ``args.device``; the forced-backward ones are CPU kernels."""
    forced = {"ebc native bwd": ours(args, "native"), "ebc fbgemm bwd": ours(args, "fbgemm")}
    return {
        "rectrain ebc": ours(args),
        **(forced if args.device == "cpu" else {}),
        "raw fbgemm tbe": raw_fbgemm(args),
        "nn.EmbeddingBag": embedding_bags(args),
    }


def main() -> None:
    args = parse_args()
    print_machine(args.device)
    torch.manual_seed(0)
    ms = time_variants(variants_for(args), args)
    print(
        f"{args.tables} tables x {args.rows} rows x {args.dim} dims, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads, {args.warmup} warm-up + {args.steps} timed steps (median)"
    )
    for name, value in ms.items():
        print(f"{name:>16}: {value:8.2f} ms/step")
    raw = ms["raw fbgemm tbe"]
    print(f"nn.EmbeddingBag + sparse Adagrad vs raw fbgemm {ms['nn.EmbeddingBag'] / raw:.2f}")
    if args.device != "cpu":
        print(f"rectrain ebc fwd+bwd vs raw fbgemm on {args.device} {ms['rectrain ebc'] / raw:.3f}")
        return
    for name in ("ebc native bwd", "ebc fbgemm bwd"):
        print(f"{name} fwd+bwd vs raw fbgemm {ms[name] / raw:.3f}")
    choice = auto_choice()
    print(f"auto kernel here: {choice.kernel} ({choice.reason})")
    print(f"rectrain ebc (auto kernel) fwd+bwd vs raw fbgemm {ms['rectrain ebc'] / raw:.3f}")
    faster = min(ms["ebc native bwd"], ms["ebc fbgemm bwd"])
    print(f"auto vs the faster forced kernel {ms['rectrain ebc'] / faster:.3f}")


if __name__ == "__main__":
    main()
