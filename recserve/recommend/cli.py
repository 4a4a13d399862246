"""``recserve pipeline``: export a recommendation pipeline package (docs/recommend.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recserve.recommend.index import INDEX_TYPES
from recserve.recommend.manifest import Limits


def add_pipeline_command(subparsers) -> None:
    p = subparsers.add_parser(
        "pipeline",
        help="export a recommendation pipeline: retrieval package + ranking package + item catalogue",
        description="Embeds the catalogue with the retrieval package's candidate tower, builds the ANN index "
        "and writes a pipeline package that `recserve serve` serves (Recommend, and as an OIP model).",
    )
    p.add_argument("--retrieval", type=Path, required=True, help="an exported two-tower package")
    p.add_argument("--ranking", type=Path, required=True, help="an exported ranking package (dlrm, dlrm_dcn)")
    p.add_argument("--catalogue", type=Path, required=True, help="item catalogue, .tsv or .parquet")
    p.add_argument("--out", type=Path, required=True, help="the pipeline package directory to write")
    p.add_argument("--user-dense", type=int, default=None, help="dense values a request sends (checked)")
    p.add_argument("--index", choices=INDEX_TYPES, default="auto", help="ANN index (default: by size)")
    p.add_argument("--target-recall", type=float, default=0.96, help="IVF: nprobe reaches this recall@100")
    defaults = Limits()
    for name in ("num_candidates", "max_candidates", "top_k", "max_k", "max_exclude"):
        flag = "--" + name.replace("_", "-")
        p.add_argument(flag, type=int, default=getattr(defaults, name), help="default %(default)s")
    p.add_argument("--batch-rows", type=int, default=65_536, help="catalogue rows read and embedded at once")
    p.add_argument("--model-name", default="recommend")
    p.add_argument("--version", default="1")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run_pipeline_export)


def run_pipeline_export(args: argparse.Namespace) -> int:
    from recserve.recommend.export import export_pipeline

    limits = Limits(args.num_candidates, args.max_candidates, args.top_k, args.max_k, args.max_exclude)
    out = export_pipeline(
        args.out,
        retrieval=args.retrieval,
        ranking=args.ranking,
        catalogue=args.catalogue,
        user_dense=args.user_dense,
        limits=limits,
        index=args.index,
        target_recall=args.target_recall,
        batch_rows=args.batch_rows,
        model_name=args.model_name,
        version=args.version,
        overwrite=args.overwrite,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    print(
        json.dumps({"pipeline": str(out), "items": manifest["catalogue"]["rows"], "index": manifest["index"]})
    )
    return 0
