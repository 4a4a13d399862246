"""The training compute bound of the standard workload on this machine: one DLRM dense step (bottom MLP, dot
interaction, top MLP, Adagrad) plus one raw FBGEMM fused row-wise-Adagrad forward+backward over the 8 tables,
at batch 2048, with no data movement, planning or framework overhead. Needs only torch and fbgemm-gpu-cpu.

    .venv/bin/python bench/compute_bound.py   # last line: compute bound examples/s N
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from machine import print_machine
from torch import nn

TABLES, ROWS, DIM, DENSE, BATCH, MEAN_LEN, STEPS = 8, 100_000, 64, 13, 2048, 20, 20


def timed(fn: Callable[[], None]) -> float:
    """Mean seconds per call after 3 warm-up calls."""
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(STEPS):
        fn()
    return (time.perf_counter() - start) / STEPS


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def sparse_step_fn(gen: torch.Generator) -> Callable[[], None]:
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, DIM, EmbeddingLocation.HOST, ComputeDevice.CPU)] * TABLES,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.05,
        pooling_mode=PoolingMode.SUM,
    )
    lengths = torch.randint(1, 2 * MEAN_LEN, (TABLES * BATCH,), generator=gen)
    offsets = torch.zeros(TABLES * BATCH + 1, dtype=torch.long)
    offsets[1:] = lengths.cumsum(0)
    indices = torch.randint(0, ROWS, (int(offsets[-1]),), generator=gen)
    return lambda: tbe(indices, offsets).sum().backward()


def dense_step_fn(gen: torch.Generator) -> Callable[[], None]:
    bottom, top = mlp([DENSE, 512, 256, DIM]), mlp([DIM + (TABLES + 1) * TABLES // 2, 512, 256, 1])
    opt = torch.optim.Adagrad([*bottom.parameters(), *top.parameters()], lr=0.05)
    x, y = torch.randn(BATCH, DENSE, generator=gen), torch.randint(0, 2, (BATCH,), generator=gen).float()
    pooled = torch.randn(BATCH, TABLES, DIM, generator=gen, requires_grad=True)
    upper = torch.triu_indices(TABLES + 1, TABLES + 1, 1)

    def step() -> None:
        d = torch.relu(bottom(x))
        z = torch.cat([d.unsqueeze(1), pooled], 1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, upper[0], upper[1]]
        logits = top(torch.cat([d, inter], 1)).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def main() -> None:
    print_machine()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    sparse, dense = timed(sparse_step_fn(gen)), timed(dense_step_fn(gen))
    print(f"FBGEMM lookups fwd+bwd: {sparse * 1e3:.1f} ms/step; dense DLRM step: {dense * 1e3:.1f} ms/step")
    print(f"compute bound examples/s {BATCH / (sparse + dense):.0f}")


if __name__ == "__main__":
    main()
