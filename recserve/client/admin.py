"""``AdminClient``: the server's admin service (``--admin-port``, default 127.0.0.1:50052).

    with AdminClient("127.0.0.1:50052", token=os.environ.get("RECSERVE_ADMIN_TOKEN")) as admin:
        name, version, swapped = admin.reload("2")   # a dir under the server's reload root, or "" = newest

Errors surface as ``grpc.RpcError``: UNAUTHENTICATED without the right token, PERMISSION_DENIED for a path
outside the reload root, FAILED_PRECONDITION for a package that does not load (the old one keeps serving).
"""

from __future__ import annotations

from pathlib import Path

from recserve.client.client import open_channel
from recserve.server.transports.protos import pb2, pb2_grpc

DEFAULT_ADMIN_TARGET = "127.0.0.1:50052"
TOKEN_ENV = "RECSERVE_ADMIN_TOKEN"


class AdminClient:
    """A channel to one server's admin port; ``token`` is sent as ``authorization: Bearer <token>``."""

    def __init__(
        self,
        target: str = DEFAULT_ADMIN_TARGET,
        *,
        token: str | None = None,
        timeout: float | None = 300.0,
        root_certificates: Path | bytes | None = None,
        client_key: Path | bytes | None = None,
        client_cert: Path | bytes | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = open_channel(target, root_certificates, client_key, client_cert)
        self._admin = pb2_grpc.AdminStub(self._channel)

    def reload(self, package_dir: str | Path = "", *, timeout: float | None = None) -> tuple[str, str, bool]:
        """Asks the server to load ``package_dir`` (default: newest under its --watch dir) and swap it in.

        Returns ``(model_name, version, swapped)``; ``swapped`` is False when that version already serves.
        """
        r = self._admin.ReloadModel(
            pb2.ReloadModelRequest(package_dir=str(package_dir)),
            timeout=self.timeout if timeout is None else timeout,
            metadata=self._metadata,
        )
        return r.model_name, r.model_version, r.swapped

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
