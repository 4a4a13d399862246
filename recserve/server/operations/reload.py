"""Hot reload: load a package beside the serving one, warm it up, swap it in; keep the old one on failure.

Two triggers share :meth:`Reloader.reload`: the ``Admin.ReloadModel`` RPC and a watch of a directory of
versioned packages (``--watch DIR``; ``--follow DIR`` runs the same scan, :meth:`Reloader.poll`, from its own
thread before it looks for deltas: :mod:`recserve.server.operations.follow`). As in Triton's model repository,
versions are sub-directories with numeric names (``DIR/1``, ``DIR/2``, ...: ASCII digits, the only versions a
manifest may record); the highest one whose ``manifest.json`` exists is the one to serve. The folder's name is
the version, exactly as a string (folder ``4`` with a manifest saying ``04`` is refused): a version folder
whose manifest records another version is refused before it is loaded (an error naming both, counted as a
failed reload), never loaded and silently discarded; so is a version folder that is a link leading out of the
watch dir. A package that fails to load is logged, counted in
``recserve_model_reloads_total{result="failure"}``, and not retried until one of its files changes. Place a
version atomically (write it elsewhere, then rename it into the watch dir), so that the watch never sees half
of it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from recserve.errors import PackageError
from recserve.server.dataplane.core import InferenceCore
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.dataplane.stats import StatsSnapshot
from recserve.server.operations.metrics import ServerMetrics

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def newest_version_dir(watch_dir: Path) -> Path | None:
    """The numerically highest ``watch_dir/<n>`` that holds a manifest, or None.

    Only folders named as a manifest's version may be (``version_problem``: ASCII digits), so that a folder
    chosen here is never one whose manifest could not match it."""
    from recserve.runtime.package import version_problem

    if not watch_dir.is_dir():
        return None
    versions = [
        (int(p.name), p)
        for p in watch_dir.iterdir()
        if version_problem(p.name) is None and p.is_dir() and (p / MANIFEST).exists()
    ]
    return max(versions)[1] if versions else None


def check_version_dir(package_dir: Path, watch_dir: Path | None) -> None:
    """PackageError when ``package_dir`` is a version folder of ``watch_dir`` that may not serve: a link that
    leads out of the watch dir, or a manifest whose version is not the folder's name, exactly."""
    if watch_dir is None:
        return
    package_dir, root = Path(package_dir), Path(watch_dir).resolve()
    if package_dir.parent.resolve() != root:
        return  # not a version folder of the watch dir (an admin reload of another package)
    target = package_dir.resolve()
    if target == root or not target.is_relative_to(root):
        raise PackageError(
            f"{package_dir}: links to {target}, outside the watch dir {root}; a version folder must be (or "
            "link to) a package inside it"
        )
    from recserve.runtime import read_manifest

    version = read_manifest(package_dir).version
    if version != package_dir.name:
        raise PackageError(
            f"{package_dir}: the folder says version {package_dir.name} but its {MANIFEST} says version "
            f"{version!r}; re-export it with --version {package_dir.name} (or move it to "
            f"{root}/{version})"
        )


class Reloader:
    """Serialises reloads of ``core``'s model; ``load`` turns a package dir into a warmed-up runner."""

    def __init__(
        self,
        core: InferenceCore,
        load: Callable[[Path], ModelRunner],
        metrics: ServerMetrics,
        *,
        watch_dir: Path | None = None,
        interval_s: float = 2.0,
    ) -> None:
        self._core = core
        self._load = load
        self._metrics = metrics
        self._watch_dir = watch_dir
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._last_package = core.runner.package_dir
        # Told whether the model serves after each swap-in or unload (the server's health statuses).
        self.on_change: Callable[[bool], None] | None = None
        self._tried: set[tuple] = set()  # version dir stamps (file names, sizes, mtimes) already attempted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reload(self, package_dir: Path | None = None) -> tuple[str, str, bool]:
        """Loads ``package_dir`` (default: the newest version under the watch dir) and swaps it in.

        Returns ``(model_name, version, swapped)``; ``swapped`` is False when that version already serves.
        Raises :class:`PackageError` when the package fails to load; the old model keeps serving.
        """
        with self._lock:
            if package_dir is None:
                if self._watch_dir is None:
                    raise PackageError("ReloadModel: package_dir is empty and the server has no --watch dir")
                package_dir = newest_version_dir(self._watch_dir)
                if package_dir is None:
                    raise PackageError(f"{self._watch_dir}: no version directory with a {MANIFEST}")
            return self._load_locked(package_dir)

    def load_latest(self, root: Path | None) -> tuple[str, str, bool]:
        """Triton's explicit load: the newest numbered version under ``root``, else the last package."""
        with self._lock:
            target = (None if root is None else newest_version_dir(root)) or self._last_package
            if target is None:
                raise PackageError(
                    "load: no numbered version under the reload root and no package served before"
                )
            return self._load_locked(target)

    def unload(self) -> bool:
        """Stops serving the model (its queued requests finish first); False if it was not loaded."""
        with self._lock:
            old = self._core.unload()
            if old is None:
                return False
            self._metrics.model_info.labels(*old.model_id).set(0)
            if self.on_change is not None:
                self.on_change(False)
            old.close()
            return True

    def statistics(self, model: str, version: str) -> StatsSnapshot:
        """``model`` ``version``'s statistics in this process (none while it serves another version)."""
        runner = self._core.current
        if runner is None or runner.model_id != (model, version):
            return StatsSnapshot()
        return runner.stats.snapshot()

    def _load_locked(self, package_dir: Path) -> tuple[str, str, bool]:
        old = self._core.current
        serving = "nothing (unloaded)" if old is None else " ".join(old.model_id)
        try:
            check_version_dir(package_dir, self._watch_dir)
            runner = self._load(package_dir)
        except Exception as exc:
            self._metrics.model_reloads.labels("failure").inc()
            logger.error("reload of %s failed, still serving %s: %s", package_dir, serving, exc)
            raise PackageError(f"{package_dir}: failed to load ({exc}); still serving {serving}") from exc
        if old is not None and runner.model_id == old.model_id:
            runner.close()
            return (*old.model_id, False)
        self._last_package = Path(package_dir)
        draining = self._core.swap(runner)
        # Announce the new model before draining the old one: requests already see it, so must /metrics.
        self._metrics.model_reloads.labels("success").inc()
        self._metrics.serving(*runner.model_id, previous=None if draining is None else draining.model_id)
        self._metrics.model_state(runner.step, runner.wall_time)
        if draining is None and self.on_change is not None:
            self.on_change(True)  # it was unloaded
        if draining is not None:
            draining.close()
        return (*runner.model_id, True)

    def start_watching(self) -> None:
        """Polls the watch dir every ``interval_s`` seconds in a daemon thread."""
        if self._watch_dir is None:
            return
        self._thread = threading.Thread(target=self._watch, name="package-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.poll()

    def poll(self) -> None:
        """One scan of the watch dir: swaps in its newest version when that is new and was not tried before
        with the same files (``--watch``'s thread, and ``--follow``'s before it looks for deltas)."""
        assert self._watch_dir is not None
        newest = newest_version_dir(self._watch_dir)
        current = self._core.current
        if newest is None or (current is not None and newest == current.package_dir):
            return
        try:
            stamp = (
                newest,
                tuple((f.name, f.stat().st_size, f.stat().st_mtime) for f in sorted(newest.iterdir())),
            )
        except FileNotFoundError:
            return
        if stamp in self._tried:
            return
        self._tried.add(stamp)
        with contextlib.suppress(PackageError):  # logged and counted by reload(); the old model serves on
            self.reload(newest)
