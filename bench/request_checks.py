"""What the predictor's always-on request checks cost, as a share of a whole ``Predictor.predict``.

``Predictor.predict(..., checked=True)`` (how the server scores merged batches) still runs every check that
keeps the FBGEMM kernels in bounds (``RequestValidator.safe_batch``): lengths bounded element-wise, offsets,
ids inside their tables, weights and dense shapes. This prints, per batch size, the median time of those
checks alone and of the whole predict they are part of, measured in the same run, and their ratio.

Model: a Criteo-shaped DLRM (13 dense, 26 int8 tables of ``--rows`` x 16), tables all the same size or of
varied sizes (``--varied``: then most batches take the per-id limit pass instead of one min/max pass).

    .venv/bin/python bench/request_checks.py [--batch-sizes 64 512] [--ids 1 4] [--varied] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor
from rectrain.embedding import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

FEATURES = [f"cat_{i}" for i in range(26)]


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _config(rows: int, varied: bool) -> ModelConfig:
    sizes = [rows // (1 + i % 4) if varied else rows for i in range(26)]
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=n, embedding_dim=16, feature_names=[f])
        for f, n in zip(FEATURES, sizes)
    ]
    return ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=13,
        dense_arch_layer_sizes=[64, 16], over_arch_layer_sizes=[64, 1],
    )  # fmt: skip


def _batch(cfg: ModelConfig, batch: int, ids: int) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    lengths = torch.randint(0, 2 * ids + 1, (26, batch))
    values = torch.cat(
        [torch.randint(0, t.num_embeddings, (int(lengths[i].sum()),)) for i, t in enumerate(cfg.tables)]
    )
    kjt = KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths.reshape(-1), stride=batch)
    return torch.randn(batch, 13), kjt


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--ids", type=int, nargs="+", default=[1, 4], help="mean ids per feature and example")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--varied", action="store_true", help="tables of different sizes")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = _config(args.rows, args.varied)
    state = {k: v.detach().clone() for k, v in build_model(cfg).state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = export_package(
            Path(tmp) / "pkg",
            model_config=cfg,
            state_dict=state,
            accuracy_sample=synthetic_sample(cfg, 64),
            force=True,
        )
        predictor = Predictor.load(path)
    validator = predictor._validator
    print(f"cpu: {_cpu()} ({platform.machine()}), torch threads {args.threads}, varied tables {args.varied}")
    print(
        f"{'batch':>6} {'ids/f':>6} {'values':>7} {'checks us':>10} {'predict us':>11} {'checks/predict':>15}"
    )
    for batch in args.batch_sizes:
        for ids in args.ids:
            dense, kjt = _batch(cfg, batch, ids)
            checks = _median_us(lambda d=dense, k=kjt: validator.safe_batch(d, k, checked=True), args.repeats)
            whole = _median_us(lambda d=dense, k=kjt: predictor.predict(d, k, checked=True), args.repeats)
            print(
                f"{batch:>6} {ids:>6} {kjt.values().numel():>7} {checks:>10.0f} {whole:>11.0f} "
                f"{checks / whole:>15.3f}"
            )


if __name__ == "__main__":
    main()
