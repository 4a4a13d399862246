"""Seconds to apply a delta (read + verify, prepare beside serving, swap between batches) against the rows the
overlay already holds: an apply must cost about the delta's size, not the overlay's (issue 45).

A DLRM of ``--tables`` int8 tables x ``--rows`` x ``--dim`` is exported as base 1; delta 1 changes
``--first`` of every table's rows, each later one (``--deltas`` in all) ``--later`` rows per table. Each is
read, prepared and committed on one predictor, as a follower does; then a fresh predictor applies all of them
folded into one (a server starting on a base with many deltas).

    .venv/bin/python bench/delta_apply.py [--tables 2] [--rows 1000000] [--dim 64] [--deltas 6]

One line per delta (its rows, the overlay's rows after it, read / prepare / commit seconds), then
``fold of N deltas read s``, ``... prepare s`` and ``... commit s``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from infer_throughput import workload_config
from machine import print_machine

from recserve.export import export_package, synthetic_sample
from recserve.export.delta import write_delta
from recserve.export.exporter import split_state_dict
from recserve.runtime import Predictor, QuantEmbeddingBagCollection, read_manifest
from recserve.runtime.delta import fold_deltas, list_stream, manifest_sha256, read_delta
from rectrain import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tables", type=int, default=2)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--deltas", type=int, default=6)
    p.add_argument("--first", type=float, default=0.9, help="fraction of rows delta 1 changes")
    p.add_argument("--later", type=int, default=40_000, help="rows per table each later delta changes")
    args = p.parse_args()
    torch.set_num_threads(1)
    print_machine()
    base_cfg = workload_config()
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", num_embeddings=args.rows, embedding_dim=args.dim, feature_names=[f"f{i}"]
        )
        for i in range(args.tables)
    ]
    cfg = ModelConfig(
        kind="dlrm",
        tables=tables,
        dense_in_features=base_cfg.dense_in_features,
        dense_arch_layer_sizes=[*base_cfg.dense_arch_layer_sizes[:-1], args.dim],
        over_arch_layer_sizes=base_cfg.over_arch_layer_sizes,
    )
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in build_model(cfg).state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        publish = Path(tmp)
        export_package(
            publish / "1", model_config=cfg, state_dict=state, accuracy_sample=synthetic_sample(cfg, 64)
        )
        dense = split_state_dict(cfg, state)[1]
        for sequence in range(1, args.deltas + 1):
            n = int(args.first * args.rows) if sequence == 1 else args.later
            rows = {t.name: (torch.randperm(args.rows)[:n], torch.randn(n, args.dim) * 0.01) for t in tables}
            write_delta(publish, "1", sequence, sequence, rows, dense)
            del rows
        base, paths = list_stream(publish)
        manifest, sha = read_manifest(base), manifest_sha256(base)
        predictor = Predictor.load(base)
        lookups = next(m for m in predictor.model.modules() if isinstance(m, QuantEmbeddingBagCollection))
        print(f"model {args.tables} x {args.rows} x {args.dim} int8")
        for sequence, path in enumerate(paths, start=1):
            started = time.perf_counter()
            delta = read_delta(path, manifest, sha, sequence)
            read_s = time.perf_counter() - started
            started = time.perf_counter()
            prepared = predictor.prepare_delta(delta)
            prepare_s = time.perf_counter() - started
            started = time.perf_counter()
            predictor.commit(prepared)
            commit_s = time.perf_counter() - started
            live = sum(k.overlay.num_rows for k in lookups._lookups if k.overlay is not None)
            print(
                f"delta {sequence}: {delta.num_rows} rows, overlay {live} rows, read s {read_s:.3f}, "
                f"prepare s {prepare_s:.3f}, commit s {commit_s:.3f}"
            )
            del delta, prepared
        fresh = Predictor.load(base)
        started = time.perf_counter()
        deltas = [read_delta(path, manifest, sha, s) for s, path in enumerate(paths, start=1)]
        folded = fold_deltas(deltas)
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        prepared = fresh.prepare_delta(folded)
        prepare_s = time.perf_counter() - started
        started = time.perf_counter()
        fresh.commit(prepared)
        commit_s = time.perf_counter() - started
    print(f"fold of {len(paths)} deltas ({folded.num_rows} rows) read s {read_s:.3f}")
    print(f"fold of {len(paths)} deltas prepare s {prepare_s:.3f}")
    print(f"fold of {len(paths)} deltas commit s {commit_s:.3f}")


if __name__ == "__main__":
    main()
