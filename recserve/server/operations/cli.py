"""``recserve serve``: registered on ``recserve``'s parser by :func:`add_serve_commands`."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from recserve.server.operations.config import ADMIN_TOKEN_ENV, MODEL_CONTROL_MODES


def add_serve_commands(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``serve`` to the ``recserve`` command line."""
    _add_serve(subparsers)


def _add_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model package over gRPC (recserve.v1 + Open Inference v2)"
    )
    p.add_argument(
        "--package", type=Path, help="model package dir (optional with --watch; not with --follow)"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback: %(default)s)")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--metrics-port", type=int, default=9400, help="Prometheus /metrics port; -1 turns it off")
    p.add_argument(
        "--http-port",
        type=int,
        default=-1,
        help="Open Inference Protocol over HTTP/REST on --host (e.g. 8000, as KServe/Triton); -1: off",
    )
    p.add_argument(
        "--http-read-timeout",
        type=float,
        default=30.0,
        help="seconds a REST request body may take to arrive (408 after; default %(default)s)",
    )
    p.add_argument(
        "--http-idle-timeout",
        type=float,
        default=15.0,
        help="seconds a REST connection may go without a complete request head (default %(default)s)",
    )
    p.add_argument(
        "--http-max-connections",
        type=int,
        default=1024,
        help="open REST connections at once; at the limit a new one closes the connection idle longest "
        "(503 only when all are busy; default %(default)s)",
    )
    p.add_argument(
        "--grpc-max-connection-age",
        type=float,
        default=3600.0,
        help="seconds before a gRPC connection is closed gracefully (clients reconnect)",
    )
    p.add_argument(
        "--grpc-max-connection-idle",
        type=float,
        default=900.0,
        help="seconds a gRPC connection may stay without RPCs",
    )
    p.add_argument(
        "--grpc-keepalive", type=float, default=60.0, help="seconds between pings of an idle gRPC connection"
    )
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument(
        "--workers",
        type=_workers_flag,
        default="auto",
        help="server processes sharing the port (SO_REUSEPORT); auto (default): one per CPU the server may "
        "use on --device cpu (each pinned to its own, one torch thread each), else 1",
    )
    p.add_argument(
        "--no-pin-workers",
        dest="pin_workers",
        action="store_false",
        help="let the kernel move --workers between CPUs (default on CPU: worker i keeps the i-th of N equal "
        "groups of the CPUs the server may use)",
    )
    p.add_argument("--max-batch-size", type=int, default=512, help="examples per batch and per request")
    p.add_argument(
        "--max-queue-delay-ms", type=float, default=2.0, help="longest wait of a batch's oldest request"
    )
    p.add_argument(
        "--max-queue-size", type=int, default=4096, help="queued requests before RESOURCE_EXHAUSTED"
    )
    p.add_argument("--grpc-threads", type=int, default=64, help="RPC handler threads per worker")
    p.add_argument(
        "--max-inflight",
        type=int,
        help="RPCs admitted at once per worker; more get RESOURCE_EXHAUSTED at once "
        "(default: --grpc-threads less 1/8, at most --max-queue-size)",
    )
    p.add_argument(
        "--max-queue-lag-ms",
        type=float,
        default=100.0,
        help="refuse new RPCs at once while RPCs wait longer than this before a handler sees them (0: off)",
    )
    p.add_argument(
        "--max-recommend-queued-ms",
        type=float,
        default=250.0,
        help="refuse a Recommend request at once when the work queued ahead of it in its worker would take "
        "longer than this, at the pace of the recent batches (0: off)",
    )
    p.add_argument("--max-message-mb", type=int, default=64, help="largest request/reply message")
    p.add_argument(
        "--request-memory-mb",
        type=float,
        help="MiB each worker's requests may hold at once, gRPC and REST (bodies, inflated bodies, decoded "
        "tensors); past it they are refused (RESOURCE_EXHAUSTED / 503). It also sets how many gRPC messages "
        "may stream in at full speed at once (this over twice --max-message-mb, at least 8). Default: a "
        "quarter of the worker's share of the memory limit, at most 512",
    )
    p.add_argument(
        "--grpc-read-timeout",
        type=float,
        default=5.0,
        help="seconds a gRPC request message may take to arrive once the server reads it; then the call "
        "ends DEADLINE_EXCEEDED (default %(default)s)",
    )
    p.add_argument(
        "--max-streaming-calls",
        type=int,
        default=16,
        help="threads for streaming gRPC calls (health Watch, reflection) per worker; more wait for one, "
        "and end DEADLINE_EXCEEDED if their first message is not in within --grpc-read-timeout "
        "(default %(default)s)",
    )
    p.add_argument("--tls-cert", type=Path, help="server certificate chain (PEM)")
    p.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    p.add_argument("--tls-client-ca", type=Path, help="require client certificates signed by this CA (PEM)")
    p.add_argument("--watch", type=Path, help="dir of numbered package versions; the newest is served")
    p.add_argument("--watch-interval", type=float, default=2.0, help="seconds between --watch scans")
    p.add_argument(
        "--follow",
        type=Path,
        metavar="DIR",
        help="a trainer's publish dir (instead of --package or --watch): serve the newest base DIR/<N> with "
        "its deltas DIR/<N>-deltas/<SEQ>, apply each new delta between batches and swap in each new base; "
        'replies say model_version "N.SEQ" (docs/online.md)',
    )
    p.add_argument(
        "--follow-interval",
        type=float,
        default=0.2,
        help="seconds between --follow scans for new deltas and bases (default %(default)s)",
    )
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds in-flight RPCs get on SIGTERM")
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--dense-dtype",
        choices=["auto", "fp32", "bf16"],
        default=None,
        help="the dense part's dtype; auto (default, or $RECSERVE_DENSE_DTYPE): bf16 where the CPU has "
        "native bf16 and the package's accuracy gate allows it, else as exported",
    )
    p.add_argument(
        "--torch-threads", type=int, help="intra-op threads per worker (default: the CPUs it runs on)"
    )
    p.add_argument("--admin-host", default="127.0.0.1", help="admin service bind address (default loopback)")
    p.add_argument(
        "--admin-port", type=int, default=50052, help="admin service (reload) port; -1 turns it off"
    )
    p.add_argument(
        "--admin-token",
        default=os.environ.get(ADMIN_TOKEN_ENV),
        help=f"bearer token admin calls must send (default ${ADMIN_TOKEN_ENV}); required off loopback "
        "unless --tls-client-ca",
    )
    p.add_argument(
        "--reload-root",
        type=Path,
        help="admin reloads load only packages under this dir (default --watch, else --package's parent)",
    )
    p.add_argument(
        "--model-control",
        "--model-control-mode",
        dest="model_control",
        choices=MODEL_CONTROL_MODES,
        default="none",
        help="none (default): Triton's repository load/unload are refused on the serving ports (reload "
        "through the admin service); explicit: they are served there too, under --admin-token when set",
    )
    p.set_defaults(func=_serve)


def _workers_flag(text: str) -> int | str:
    """``--workers``: a count, or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {text!r}") from None


def _serve(args: argparse.Namespace) -> int:
    from recserve.server.operations.config import ServeConfig
    from recserve.server.operations.workers import resolve_workers, serve

    logging.getLogger("recserve").setLevel(min(logging.INFO, logging.getLogger().getEffectiveLevel()))
    cfg = ServeConfig(
        package=args.package,
        host=args.host,
        port=args.port,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        metrics_host=args.metrics_host,
        http_port=None if args.http_port < 0 else args.http_port,
        http_read_timeout_s=args.http_read_timeout,
        http_idle_timeout_s=args.http_idle_timeout,
        http_max_connections=args.http_max_connections,
        grpc_max_connection_age_s=args.grpc_max_connection_age,
        grpc_max_connection_idle_s=args.grpc_max_connection_idle,
        grpc_keepalive_s=args.grpc_keepalive,
        workers=resolve_workers(args.workers, args.device, (args.port, args.http_port, args.admin_port)),
        pin_workers=args.pin_workers,
        max_batch_size=args.max_batch_size,
        max_queue_delay_ms=args.max_queue_delay_ms,
        max_queue_size=args.max_queue_size,
        grpc_threads=args.grpc_threads,
        max_inflight=args.max_inflight,
        max_queue_lag_ms=args.max_queue_lag_ms,
        max_recommend_queued_ms=args.max_recommend_queued_ms,
        max_message_bytes=args.max_message_mb * 1024 * 1024,
        request_memory_bytes=None if args.request_memory_mb is None else int(args.request_memory_mb * 2**20),
        grpc_read_timeout_s=args.grpc_read_timeout,
        max_streaming_calls=args.max_streaming_calls,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        watch=args.watch,
        watch_interval_s=args.watch_interval,
        follow=args.follow,
        follow_interval_s=args.follow_interval,
        drain_timeout_s=args.drain_timeout,
        device=args.device,
        dense_dtype=args.dense_dtype,
        torch_threads=args.torch_threads,
        admin_host=args.admin_host,
        admin_port=None if args.admin_port < 0 else args.admin_port,
        admin_token=args.admin_token,
        reload_root=args.reload_root,
        model_control=args.model_control,
    )
    return serve(cfg)
