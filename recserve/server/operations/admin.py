"""The admin plane: ``recserve.v1.Admin`` on its own port, off the data plane.

It listens on ``--admin-host:--admin-port`` (default 127.0.0.1:50052), with its own few handler threads, so
that an overloaded data port never delays a reload and a reload is never reachable from where predictions
are. Beyond loopback it needs authentication (checked by :class:`ServeConfig`): a bearer token
(``--admin-token`` or ``RECSERVE_ADMIN_TOKEN``, sent as ``authorization: Bearer <token>`` metadata) or client
certificates (``--tls-client-ca``). ``ReloadModel`` loads only directories under the reload root
(``--reload-root``, default the ``--watch`` dir, else the ``--package`` dir's parent), resolving symlinks
and ``..``.
"""

from __future__ import annotations

import hmac
import logging
from concurrent import futures
from pathlib import Path

import grpc
from grpc_reflection.v1alpha import reflection

from recserve.errors import InvalidRequestError, PermissionDeniedError, UnauthenticatedError
from recserve.server.operations.config import ServeConfig
from recserve.server.operations.control import ModelControl
from recserve.server.operations.metrics import ServerMetrics
from recserve.server.transports.handlers import DecodeFailureLog, add_service
from recserve.server.transports.protos import ADMIN_SERVICE, pb2, pb2_grpc
from recserve.server.transports.status import StatusInterceptor

logger = logging.getLogger(__name__)

AUTH_METADATA_KEY = "authorization"
_ADMIN_THREADS = 4


def bearer_matches(value: str | bytes | None, token: str) -> bool:
    """Whether an ``authorization`` value is ``Bearer <token>`` (compared in constant time)."""
    if value is None:
        return False
    got = value.encode() if isinstance(value, str) else value
    return hmac.compare_digest(got, f"Bearer {token}".encode())


def resolve_under_root(package_dir: str, root: Path | None) -> Path:
    """``package_dir`` (absolute, or relative to ``root``) resolved; PermissionDeniedError outside root."""
    if "\x00" in package_dir:
        raise InvalidRequestError(f"package_dir {package_dir!r}: contains a NUL byte")
    if root is None:
        raise PermissionDeniedError(
            f"package_dir {package_dir!r}: this server has no reload root; start it with --reload-root DIR"
        )
    resolved = (root / package_dir).resolve()  # an absolute package_dir replaces root
    if not resolved.is_relative_to(root):
        raise PermissionDeniedError(
            f"package_dir {package_dir!r}: resolves to {resolved}, outside the reload root {root} "
            "(--reload-root); admin reloads load only packages under it"
        )
    return resolved


class AdminServicer(pb2_grpc.AdminServicer):
    def __init__(self, control: ModelControl, root: Path | None) -> None:
        self._control = control
        self._root = root

    def ReloadModel(
        self, request: pb2.ReloadModelRequest, context: grpc.ServicerContext
    ) -> pb2.ReloadModelResponse:
        package_dir = resolve_under_root(request.package_dir, self._root) if request.package_dir else None
        name, version, swapped = self._control.reload(package_dir)
        return pb2.ReloadModelResponse(model_name=name, model_version=version, swapped=swapped)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call whose metadata lacks ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._token = token

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or self._authorized(handler_call_details):
            return handler

        def refuse(request, context):
            raise UnauthenticatedError(
                f"{handler_call_details.method}: admin calls need '{AUTH_METADATA_KEY}: Bearer <token>' "
                "metadata with the server's --admin-token"
            )

        return grpc.unary_unary_rpc_method_handler(
            refuse,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _authorized(self, handler_call_details) -> bool:
        metadata = dict(handler_call_details.invocation_metadata or ())
        return bearer_matches(metadata.get(AUTH_METADATA_KEY), self._token)


def build_admin_server(cfg: ServeConfig, control: ModelControl, metrics: ServerMetrics) -> grpc.Server:
    """The admin gRPC server (not started); counted in the same metrics as the data plane."""
    interceptors: list[grpc.ServerInterceptor] = [StatusInterceptor(metrics)]
    if cfg.admin_token is not None:
        interceptors.append(TokenInterceptor(cfg.admin_token))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=_ADMIN_THREADS, thread_name_prefix="grpc-admin"),
        interceptors=interceptors,
        options=[("grpc.so_reuseport", 1 if cfg.workers > 1 else 0)],
    )
    add_service(server, pb2, "Admin", AdminServicer(control, cfg.effective_reload_root), DecodeFailureLog())
    reflection.enable_server_reflection((ADMIN_SERVICE, reflection.SERVICE_NAME), server)
    return server
