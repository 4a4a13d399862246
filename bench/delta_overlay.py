"""Per-batch cost of serving rows changed by deltas (the overlay path) against the base package's plain path.

The standard workload's DLRM (``infer_throughput``: 8 tables x 100,000 x 64, ids per bag uniform 1..39) is
exported once as base 1; its predictor is timed (lookups alone, and the whole ``predict``) at ``--batch``,
then ``--deltas`` deltas each changing ``--fraction`` of every table's rows are applied and the same request
is timed again. On the overlay path every batch gathers the rows it reads into a compact table (base rows
from the shared mapping, changed rows from the overlay) and runs the same FBGEMM op over it, so its extra cost
is that gather, growing with the ids per batch rather than with the overlay's size.

    .venv/bin/python bench/delta_overlay.py [--batch 512] [--fraction 0.01] [--deltas 3] [--seconds 1.0]

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
from infer_throughput import E, T, make_request, workload_config
from machine import print_machine

from recserve.export import export_package, synthetic_sample
from recserve.export.delta import write_delta
from recserve.export.exporter import split_state_dict
from recserve.runtime import Predictor, QuantEmbeddingBagCollection, read_manifest
from recserve.runtime.delta import list_stream, manifest_sha256, read_delta
from rectrain.models import build_model


def best_median(fn: Callable[[], object], seconds: float, repeats: int = 3) -> float:
    """The lowest of ``repeats`` medians of per-call seconds (other load on a shared machine only adds)."""
    fn()
    medians = []
    for _ in range(repeats):
        times, until = [], time.perf_counter() + seconds / repeats
        while time.perf_counter() < until or len(times) < 5:
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        medians.append(statistics.median(times))
    return min(medians)


def timings(predictor: Predictor, batch: int, seconds: float) -> tuple[float, float]:
    dense, kjt = make_request(batch)
    lookups = next(m for m in predictor.model.modules() if isinstance(m, QuantEmbeddingBagCollection))
    with torch.inference_mode():
        lookup_s = best_median(lambda: lookups(kjt), seconds)
    return lookup_s, best_median(lambda: predictor.predict(dense, kjt), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--deltas", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    print_machine()
    cfg = workload_config()
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in build_model(cfg).state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        publish = Path(tmp)
        export_package(
            publish / "1", model_config=cfg, state_dict=state, accuracy_sample=synthetic_sample(cfg, 256)
        )
        predictor = Predictor.load(publish / "1")
        plain = timings(predictor, args.batch, args.seconds)
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
        for sequence, path in enumerate(paths, start=1):
            predictor.apply_delta(read_delta(path, manifest, sha, sequence))
        overlay = timings(predictor, args.batch, args.seconds)
    ids = int(make_request(args.batch)[1].values().numel())
    print(f"batch {args.batch}: {ids} ids over {T} tables; overlay {predictor.overlay_bytes / 1e6:.1f} MB")
    print(f"{'':<10}{'plain ms':>10}{'overlay ms':>12}{'extra ms':>10}")
    for name, a, b in (("lookups", plain[0], overlay[0]), ("predict", plain[1], overlay[1])):
        print(f"{name:<10}{a * 1e3:>10.3f}{b * 1e3:>12.3f}{(b - a) * 1e3:>10.3f}")
    print(f"overlay vs plain lookups {overlay[0] / plain[0]:.3f}")
    print(f"overlay vs plain predict {overlay[1] / plain[1]:.3f}")


if __name__ == "__main__":
    main()
