"""Model control that reaches every worker: a reload, load or unload of a ``--workers N`` server is all of it.

The kernel hands a control call (admin ``ReloadModel``, Triton's repository load/unload, their REST forms) to
one worker. Applied there alone, that worker would serve the new model (or none) while the others went on
serving the old one, each to the connections the kernel gave it. :class:`SharedControl` makes every such
action the whole server's: the worker that receives it appends it to a log in a directory the parent created
(one JSON file per action, numbered under a file lock), every worker's follower thread applies the log in
order and acknowledges each action with its outcome, and the receiving worker answers once all N have, with
the error of any that failed, and removes the action's files. A worker that starts late applies what it
missed before it follows (an action is complete only once every worker has run and acknowledged it).

Triton's statistics call goes the same way, so that it reports the model's requests whichever worker served
them: each worker acknowledges with its own statistics of the version asked for, and the answer sums them.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from recserve.errors import InvalidRequestError, PackageError, UnavailableError
from recserve.server.dataplane.stats import StatsSnapshot, merged, snapshot_from_json, snapshot_to_json
from recserve.server.operations.reload import Reloader

logger = logging.getLogger(__name__)

# A worker reads the control log every poll_s for BUSY_SECONDS after an action, every IDLE_POLL_S otherwise.
BUSY_SECONDS = 5.0
IDLE_POLL_S = 0.2

# The errors a worker's apply can raise that keep their status code when the receiving worker reports them.
_KNOWN_ERRORS = {cls.__name__: cls for cls in (PackageError, UnavailableError, InvalidRequestError)}


class ModelControl(Protocol):
    """What the control calls do to the served model (:class:`Reloader` in one process)."""

    def reload(self, package_dir: Path | None = None) -> tuple[str, str, bool]: ...

    def load_latest(self, root: Path | None) -> tuple[str, str, bool]: ...

    def unload(self) -> bool: ...

    def statistics(self, model: str, version: str) -> StatsSnapshot: ...


class SharedControl:
    """:class:`ModelControl` for worker ``index`` of ``workers``, coordinated through ``control_dir``."""

    def __init__(
        self,
        reloader: Reloader,
        control_dir: Path,
        index: int,
        workers: int,
        *,
        poll_s: float = 0.05,
        timeout_s: float = 600.0,
    ) -> None:
        self._reloader = reloader
        self._dir = Path(control_dir)
        self._index = index
        self._workers = workers
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._applied = 0  # actions are numbered from 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reload(self, package_dir: Path | None = None) -> tuple[str, str, bool]:
        name, version, swapped = self._run({"kind": "reload", "path": _str(package_dir)})
        return name, version, swapped

    def load_latest(self, root: Path | None) -> tuple[str, str, bool]:
        name, version, swapped = self._run({"kind": "load_latest", "path": _str(root)})
        return name, version, swapped

    def unload(self) -> bool:
        return bool(self._run({"kind": "unload", "path": None}))

    def statistics(self, model: str, version: str) -> StatsSnapshot:
        """``model`` ``version``'s statistics summed over the workers that serve it."""
        per_worker = self._run(
            {"kind": "statistics", "path": None, "model_id": [model, version]}, all_results=True
        )
        return merged([snapshot_from_json(s) for s in per_worker])

    def start(self) -> None:
        """Applies the actions logged so far (a worker that started late), then follows the log."""
        self._catch_up()
        self._thread = threading.Thread(target=self._follow, name="model-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, action: dict, all_results: bool = False):
        number = self._publish(action)
        deadline = time.monotonic() + self._timeout_s
        acks: dict[int, dict] = {}
        while len(acks) < self._workers:
            for i in range(self._workers):
                if i not in acks and (ack := _read_json(self._ack_path(number, i))) is not None:
                    acks[i] = ack
            if len(acks) < self._workers:
                if self._stop.is_set():
                    raise UnavailableError(
                        f"{action['kind']}: the server is stopping; the workers may differ"
                    )
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self._workers)) - set(acks))
                    raise UnavailableError(
                        f"{action['kind']}: worker(s) {missing} of {self._workers} did not apply it within "
                        f"{self._timeout_s:g} s; the workers may now serve different models"
                    )
                self._stop.wait(self._poll_s)
        # Every worker has applied it (a worker acknowledges only once it runs): nobody reads these again.
        for path in (self._action_path(number), *(self._ack_path(number, i) for i in acks)):
            path.unlink(missing_ok=True)
        failed = {i: ack for i, ack in acks.items() if not ack["ok"]}
        if failed:
            i, ack = min(failed.items())
            applied = sorted(set(acks) - set(failed))
            where = f"worker {i}" + ("" if not applied else f" (workers {applied} applied it)")
            raise _KNOWN_ERRORS.get(ack["error_type"], RuntimeError)(f"{where}: {ack['error']}")
        if all_results:
            return [acks[i]["result"] for i in range(self._workers)]
        return acks[self._index]["result"]

    def _publish(self, action: dict) -> int:
        with open(self._dir / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            last = _read_json(self._dir / "last.json")
            number = 1 if last is None else last["number"] + 1
            _write_json(self._action_path(number), action)
            _write_json(self._dir / "last.json", {"number": number})
        if action["kind"] != "statistics":  # tools poll statistics: only model changes are worth a line
            logger.info(
                "model control: %s %s sent to %d workers", action["kind"], action["path"] or "", self._workers
            )
        return number

    def _follow(self) -> None:
        # Actions come in bursts (a reload, then the statistics a tool polls): the log is read every poll_s
        # for a while after one, and every IDLE_POLL_S otherwise, so that a worker at rest barely wakes.
        last = time.monotonic()
        while not self._stop.wait(self._poll_s if time.monotonic() - last < BUSY_SECONDS else IDLE_POLL_S):
            if self._catch_up():
                last = time.monotonic()

    def _catch_up(self) -> bool:
        """Applies the actions logged since the last one applied; True if there were any."""
        applied = self._applied
        while (action := _read_json(self._action_path(self._applied + 1))) is not None:
            self._applied += 1
            _write_json(self._ack_path(self._applied, self._index), self._apply(action))
        return self._applied > applied

    def _apply(self, action: dict) -> dict:
        path = None if action["path"] is None else Path(action["path"])
        try:
            if action["kind"] == "reload":
                result = list(self._reloader.reload(path))
            elif action["kind"] == "load_latest":
                result = list(self._reloader.load_latest(path))
            elif action["kind"] == "statistics":
                result = snapshot_to_json(self._reloader.statistics(*action["model_id"]))
            else:
                result = self._reloader.unload()
        except Exception as exc:  # reported to the worker that answers the call
            if type(exc).__name__ not in _KNOWN_ERRORS:
                logger.exception("model control: %s failed", action["kind"])
            return {"ok": False, "error": str(exc), "error_type": type(exc).__name__}
        return {"ok": True, "result": result}

    def _action_path(self, number: int) -> Path:
        return self._dir / f"action-{number:08d}.json"

    def _ack_path(self, number: int, index: int) -> Path:
        return self._dir / f"ack-{number:08d}-{index}.json"


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _write_json(path: Path, obj: dict) -> None:
    """Written whole, then renamed into place: a reader sees the old state or the new, never half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
