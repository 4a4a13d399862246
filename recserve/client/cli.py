"""``recserve query | loadgen``, the client's commands: registered on ``recserve``'s parser by
:func:`add_client_commands`."""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

import torch

from recserve.client.admin import TOKEN_ENV
from recserve.errors import InvalidRequestError


def add_client_commands(subparsers: argparse._SubParsersAction) -> None:
    """Registers ``query`` and ``loadgen`` on the ``recserve`` parser."""
    _add_query(subparsers)
    _add_loadgen(subparsers)


def _add_query(subparsers) -> None:
    p = subparsers.add_parser(
        "query", help="score examples from a JSON/CSV file (or random ones) on a server"
    )
    p.add_argument("--target", default="127.0.0.1:50051", help="host:port")
    p.add_argument(
        "--input", type=Path, help=".json {dense: [[..]], sparse: {f: [[ids]..]}} or .csv (see docs)"
    )
    p.add_argument("--random", type=int, default=1, help="without --input: this many random valid examples")
    p.add_argument("--metadata", action="store_true", help="print the served model's schema and exit")
    p.add_argument(
        "--reload",
        metavar="DIR",
        nargs="?",
        const="",
        help="admin: load DIR, under the server's reload root (or the newest version); uses --admin-target",
    )
    p.add_argument("--admin-target", default="127.0.0.1:50052", help="the server's admin host:port")
    p.add_argument(
        "--admin-token",
        default=os.environ.get(TOKEN_ENV),
        help=f"admin token (default ${TOKEN_ENV})",
    )
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--tls-ca", type=Path, help="CA that signed the server's certificate (enables TLS)")
    p.add_argument("--tls-cert", type=Path, help="client certificate (mutual TLS)")
    p.add_argument("--tls-key", type=Path, help="client key (mutual TLS)")
    p.set_defaults(func=_query)


def _query(args: argparse.Namespace) -> int:
    from recserve.client import AdminClient, PredictorClient

    if args.reload is not None:
        admin = AdminClient(
            args.admin_target,
            token=args.admin_token,
            timeout=max(args.timeout, 300.0),
            root_certificates=args.tls_ca,
            client_key=args.tls_key,
            client_cert=args.tls_cert,
        )
        with admin:
            name, version, swapped = admin.reload(args.reload)
        print(json.dumps({"model_name": name, "model_version": version, "swapped": swapped}))
        return 0
    client = PredictorClient(
        args.target,
        timeout=args.timeout,
        root_certificates=args.tls_ca,
        client_key=args.tls_key,
        client_cert=args.tls_cert,
    )
    with client:
        model = client.metadata()
        if args.metadata:
            print(json.dumps(_model_dict(model), indent=2))
            return 0
        if args.input is None:
            dense, sparse = _random_example(model, args.random)
        else:
            dense, sparse = read_examples(args.input, model.feature_names)
        scores = client.predict_lists(dense, sparse)
        print(json.dumps({"model_name": model.model_name, "model_version": model.version, "scores": scores}))
    return 0


def _model_dict(model) -> dict:
    return {
        "model_name": model.model_name,
        "model_version": model.version,
        "dense_in_features": model.dense_in_features,
        "max_batch_size": model.max_batch_size,
        "sparse_features": [vars(f) for f in model.features],
    }


def _random_example(model, n: int) -> tuple[list[list[float]], dict[str, list[list[int]]]]:
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(n, model.dense_in_features, generator=g).tolist()
    sparse = {
        f.name: [torch.randint(0, f.num_embeddings, (3,), generator=g).tolist() for _ in range(n)]
        for f in model.features
    }
    return dense, sparse


def read_examples(path: Path, features: list[str]) -> tuple[list[list[float]], dict[str, list[list[int]]]]:
    """Examples from ``.json`` (``{"dense": [[...]], "sparse": {"f0": [[ids], ...]}}``) or ``.csv``.

    CSV: a header row, one example per row; a column named after a model feature holds that feature's ids
    separated by spaces, every other column is a dense feature, in column order.
    """
    if path.suffix == ".json":
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or "sparse" not in doc:
            raise InvalidRequestError(f"{path}: expected an object with 'dense' and 'sparse' keys")
        return doc.get("dense", []), doc["sparse"]
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise InvalidRequestError(f"{path}: no example rows under the header")
        dense_cols = [c for c in rows[0] if c not in features]
        try:
            dense = [[float(r[c]) for c in dense_cols] for r in rows]
            sparse = {k: [[int(x) for x in r[k].split()] for r in rows] for k in features if k in rows[0]}
        except ValueError as exc:
            raise InvalidRequestError(f"{path}: {exc}") from None
        return dense, sparse
    raise InvalidRequestError(f"{path}: expected a .json or .csv file")


def _add_loadgen(subparsers) -> None:
    p = subparsers.add_parser(
        "loadgen", aliases=["bench"], help="closed-loop load test: throughput and latency"
    )
    p.add_argument("--target", default="127.0.0.1:50051", help="host:port")
    p.add_argument("--concurrency", type=int, default=32, help="callers in flight at once")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds (after --warmup)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument(
        "--batch", "--request-batch", dest="batch", type=int, default=64, help="examples per request"
    )
    p.add_argument("--processes", type=int, help="client processes (default min(concurrency, cores))")
    p.add_argument("--sweep", help="comma-separated concurrency levels, e.g. 1,4,16,32,64: prints a table")
    p.set_defaults(func=_loadgen)


def _loadgen(args: argparse.Namespace) -> int:
    from recserve.client.loadgen import LoadgenConfig, format_table, run_loadgen, sweep

    cfg = LoadgenConfig(
        target=args.target,
        concurrency=args.concurrency,
        duration_s=args.duration,
        request_batch=args.batch,
        processes=args.processes,
        warmup_s=args.warmup,
    )
    if args.sweep:
        print(format_table(sweep(cfg, [int(c) for c in args.sweep.split(",")])))
        return 0
    print(run_loadgen(cfg).summary())
    return 0
