"""The image's HEALTHCHECK: exit 0 when the local server answers the gRPC health check with SERVING, else 1.

Docker runs this inside the container (no network beyond loopback): ``python /opt/recserve/healthcheck.py``.
The target defaults to ``127.0.0.1:$RECSERVE_PORT`` (50051, ``recserve serve``'s default port) and the
service to ``recserve.v1.Predictor``, which the server marks SERVING once a model package is loaded. It speaks
plaintext gRPC, as do Kubernetes' native ``grpc`` probes.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_SERVICE = "recserve.v1.Predictor"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="healthcheck", description=__doc__.splitlines()[0])
    port = os.environ.get("RECSERVE_PORT", "50051")
    parser.add_argument("--target", default=f"127.0.0.1:{port}", help="host:port (default %(default)s)")
    parser.add_argument("--service", default=DEFAULT_SERVICE, help="health service name ('' = the server)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the reply")
    return parser


def check(target: str, service: str, timeout: float) -> tuple[bool, str]:
    """(serving, a one-line description of what the server answered)."""
    request = health_pb2.HealthCheckRequest(service=service)
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout)
        except grpc.RpcError as e:
            return False, f"{target} {service!r}: {e.code().name}: {e.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{target} {service!r}: {status}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    serving, message = check(args.target, args.service, args.timeout)
    print(message, file=sys.stdout if serving else sys.stderr)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
