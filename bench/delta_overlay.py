"""Per-batch cost of serving rows changed by deltas (the overlay path) against the base package's plain path.

``--shape standard``: the standard workload's DLRM (``infer_throughput``: 8 int8 tables x 100,000 x 64,
ids per bag uniform 1..39, bottom 13-512-256-64, top 512-256-1); ``--shape criteo``: the same MLPs over 26
tables x 100,000 x 64 with one id per bag (Criteo's 26 categorical columns). Base 1 is exported, then
``--deltas`` deltas each changing ``--fraction`` of every table's rows. On the overlay path the kernel reads
changed rows in place (``recserve/runtime/stitched.py``: the package's pages and a log of changed rows in one
range; each batch remaps its ids with FBGEMM's ``pruned_array_lookup``): its extra cost is one array read
per id, and the reads of log rows.

    .venv/bin/python bench/delta_overlay.py [--shape standard|criteo] [--batch 512] [--fraction 0.01]
        [--deltas 3] [--seconds 8] [--repeats 4] [--threads 1]

Two predictors of the same base (sharing its mapping), one plain and one with the deltas applied, are timed
alternately, and each keeps its best median.

Last lines: ``overlay vs plain lookups <ratio>`` and ``overlay vs plain predict <ratio>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from infer_throughput import E, make_request, workload_config
from machine import print_machine

from recserve.export import export_package, synthetic_sample
from recserve.export.delta import write_delta
from recserve.export.exporter import split_state_dict
from recserve.runtime import Predictor, QuantEmbeddingBagCollection, read_manifest
from recserve.runtime.delta import list_stream, manifest_sha256, read_delta
from rectrain import EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.models import build_model
from rectrain.models.config import ModelConfig

CRITEO_TABLES = 26


def criteo_config() -> ModelConfig:
    cfg = workload_config()
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=E, embedding_dim=64, feature_names=[f"f{i}"])
        for i in range(CRITEO_TABLES)
    ]
    return ModelConfig(
        kind="dlrm",
        tables=tables,
        dense_in_features=cfg.dense_in_features,
        dense_arch_layer_sizes=cfg.dense_arch_layer_sizes,
        over_arch_layer_sizes=cfg.over_arch_layer_sizes,
    )


def criteo_request(batch: int) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(0)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(CRITEO_TABLES)],
        values=torch.randint(0, E, (CRITEO_TABLES * batch,), generator=g),
        lengths=torch.ones(CRITEO_TABLES * batch, dtype=torch.int64),
    )
    return torch.randn(batch, 13, generator=g), kjt


SHAPES = {"standard": (workload_config, make_request), "criteo": (criteo_config, criteo_request)}


def median_seconds(fn: Callable[[], object], seconds: float) -> float:
    """The median per-call seconds of ``fn`` over about ``seconds`` (at least 5 calls)."""
    times, until = [], time.perf_counter() + seconds
    while time.perf_counter() < until or len(times) < 5:
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def compare(
    plain: Predictor, overlay: Predictor, request: tuple, seconds: float, repeats: int
) -> list[list[float]]:
    """``[[plain lookups, overlay lookups], [plain predict, overlay predict]]`` seconds: the two predictors
    alternate ``repeats`` times and each keeps its best median (other load on a shared machine only adds)."""
    dense, kjt = request
    calls = []
    for predictor in (plain, overlay):
        lookups = next(m for m in predictor.model.modules() if isinstance(m, QuantEmbeddingBagCollection))
        calls.append((lambda lk=lookups: lk(kjt), lambda p=predictor: p.predict(dense, kjt)))
    best = [[float("inf")] * 2 for _ in range(2)]
    with torch.inference_mode():
        for _ in range(repeats):
            for side, (lookup, predict) in enumerate(calls):
                for what, fn in enumerate((lookup, predict)):
                    fn()
                    best[what][side] = min(best[what][side], median_seconds(fn, seconds / (4 * repeats)))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="standard")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--deltas", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="timing, both paths together")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steady on a shared machine)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_machine()
    make_config, make_batch = SHAPES[args.shape]
    cfg, request = make_config(), make_batch(args.batch)
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in build_model(cfg).state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        publish = Path(tmp)
        export_package(
            publish / "1", model_config=cfg, state_dict=state, accuracy_sample=synthetic_sample(cfg, 256)
        )
        changed = max(1, int(args.fraction * E))
        dense = split_state_dict(cfg, state)[1]
        for sequence in range(1, args.deltas + 1):
            rows = {
                t.name: (torch.randperm(E)[:changed], torch.randn(changed, t.embedding_dim) * 0.01)
                for t in cfg.tables
            }
            write_delta(publish, "1", sequence, sequence, rows, dense)
        base, paths = list_stream(publish)
        manifest, sha = read_manifest(base), manifest_sha256(base)
        plain, predictor = Predictor.load(base), Predictor.load(base)
        for sequence, path in enumerate(paths, start=1):
            predictor.apply_delta(read_delta(path, manifest, sha, sequence))
        (lookup_plain, lookup_overlay), (predict_plain, predict_overlay) = compare(
            plain, predictor, request, args.seconds, args.repeats
        )
        plain_t, overlay_t = (lookup_plain, predict_plain), (lookup_overlay, predict_overlay)
    ids = int(request[1].values().numel())
    print(
        f"{args.shape}, batch {args.batch}: {ids} ids over {len(cfg.tables)} tables; "
        f"overlay {predictor.overlay_bytes / 1e6:.1f} MB"
    )
    print(f"{'':<10}{'plain ms':>10}{'overlay ms':>12}{'extra ms':>10}")
    for name, a, b in (("lookups", plain_t[0], overlay_t[0]), ("predict", plain_t[1], overlay_t[1])):
        print(f"{name:<10}{a * 1e3:>10.3f}{b * 1e3:>12.3f}{(b - a) * 1e3:>10.3f}")
    print(f"overlay vs plain lookups {overlay_t[0] / plain_t[0]:.3f}")
    print(f"overlay vs plain predict {overlay_t[1] / plain_t[1]:.3f}")


if __name__ == "__main__":
    main()
