"""``recserve serve --follow DIR``: serve a trainer's publish dir, base and deltas, as training goes on.

The layout is the delta contract's (docs/online.md): ``DIR/<N>/`` bases, ``DIR/<N>-deltas/<SEQ>/`` the rows
changed since delta SEQ-1 of base N. Every ``interval_s`` a follower thread (one per worker process):

1. asks the :class:`~recserve.server.operations.reload.Reloader` to swap in a newer base, as ``--watch``
   does; the reloader's load function is :meth:`Follower.load`, so the new base is loaded beside the serving
   one and catches up on its deltas before it serves (so does the first base, at start);
2. reads and verifies the next deltas of the serving base (``read_delta``: checksums, base, sequence,
   dtypes), as many as are complete (a server starting on a base with many deltas, or one catching up,
   folds them into one: latest row wins), prepares the next version on this thread beside serving
   (``Predictor.prepare_delta``), then swaps it in in the runner's turn between two batches
   (:meth:`ModelRunner.between_batches`), so that every batch is scored by exactly one version and the
   batch path waits only for the swap. The thread runs at nice + ``FOLLOWER_NICE``: the batches, and a
   trainer on the same cores, preempt it; the swap runs on the batch thread.

``apply_delta`` keeps the changed rows in a per-worker overlay: the tables the workers map from the base's
files are never written or copied here.

A delta that is refused (fails verification, names another base, or comes after a missing one) is logged
once, counted in ``recserve_model_deltas_refused_total{reason}``, and the last good version serves on. It is
not read again until its files change, or, when it was refused for a missing predecessor, until the follower
has moved on (the missing one arrived). A new base restarts the stream. Folders vanishing under the follower
(the trainer retiring old bases) are skipped quietly.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from recserve.errors import PackageError
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.operations.metrics import ServerMetrics
from rectrain.priority import lower_thread_priority

if TYPE_CHECKING:
    from recserve.runtime.package import PackageManifest

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FOLLOWER_NICE = 5  # CFS weight 335 vs 1024: about a third of a normal thread's share when both run


def deltas_of(publish_dir: Path, base_version: str) -> dict[int, Path]:
    """The deltas placed for base ``base_version``: ``{sequence: folder}``, named as the writer names them
    (staging dot-names left out; empty when the base has none, or its deltas folder was retired).

    Not ``list_stream``, which lists the newest base's only: the serving base is older while a newer one
    fails to load."""
    from recserve.runtime.delta import delta_dir, deltas_dir

    folder = deltas_dir(publish_dir, base_version)
    try:
        names = os.listdir(folder)  # names only: a follower lists this every scan, with every delta in it
    except (FileNotFoundError, NotADirectoryError):
        return {}
    # Named exactly as the writer names them (zero-padded to a width), so sequence 7 is one folder, not
    # "7" and "07" (checked by length and leading digit: a Path per name costs more than the listing).
    width = len(delta_dir(folder, "", 1).name)
    return {
        int(n): folder / n
        for n in names
        if n.isascii() and n.isdigit() and (len(n) == width or (len(n) > width and n[0] != "0"))
    }


def next_sequence(version: str) -> int:
    """The delta a runner serving ``version`` (``"N"`` or ``"N.SEQ"``) applies next."""
    _, _, seq = version.partition(".")
    return int(seq) + 1 if seq else 1


def files_stamp(folder: Path) -> tuple | None:
    """What identifies a folder's contents without reading them (None when it vanished): rewritten files,
    or a folder replaced by another of the same name, give another stamp."""
    try:
        return (
            folder.stat().st_ino,
            tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.iterdir())),
        )
    except (FileNotFoundError, NotADirectoryError):
        return None


@dataclass(frozen=True)
class _Base:
    """The base a runner serves, as deltas name it."""

    version: str
    model_name: str
    manifest: PackageManifest
    manifest_sha256: str


class Follower:
    """Keeps one worker's served model at the newest version ``publish_dir`` holds."""

    def __init__(self, publish_dir: Path, metrics: ServerMetrics, *, interval_s: float = 0.2) -> None:
        self._dir = Path(publish_dir)
        self._metrics = metrics
        self._interval_s = interval_s
        self._bases: dict[Path, _Base] = {}  # per base package dir: its manifest and the manifest's sha256
        # Refused delta folder -> (its stamp, the sequence the runner expected) when it was refused.
        self._refused: dict[Path, tuple[tuple | None, int]] = {}
        # An admin reload may load a base (and call load) while the follower thread applies deltas.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def load(self, runner: ModelRunner) -> ModelRunner:
        """``runner`` (a base just loaded, not serving yet) with every delta of its base applied that is
        complete now; the reloader's load function wraps ``load_runner`` with it."""
        self.follow(runner)
        return runner

    def start(self, poll_bases: Callable[[], None], current: Callable[[], ModelRunner | None]) -> None:
        """Polls every ``interval_s`` seconds in a daemon thread: ``poll_bases()`` (the reloader's scan),
        then the deltas of ``current()``'s base."""
        self._thread = threading.Thread(target=self._run, args=(poll_bases, current), name="delta-follow")
        self._thread.daemon = True
        self._thread.start()

    def _run(self, poll_bases: Callable[[], None], current: Callable[[], ModelRunner | None]) -> None:
        # Reading, verifying and preparing a delta (and loading a new base) gives way to the batches this
        # worker serves and to the trainer beside it: a batch preempts it rather than sharing a core with it
        # (the swap itself runs on the batch thread). Mildly: it must still keep up with a delta a second
        # on a busy machine (at nice + 10, with load 14-16 on 2 cores, it fell 18 s behind).
        lower_thread_priority(FOLLOWER_NICE)
        last_error = ""
        while not self._stop.wait(self._interval_s):
            try:
                poll_bases()
                runner = current()
                if runner is not None:
                    self.follow(runner)
                last_error = ""
            except Exception as error:  # one bad scan never ends following; the model serves on
                if repr(error) != last_error:  # logged once while the same error repeats
                    logger.exception(
                        "--follow %s: scan failed; retrying every %.1f s", self._dir, self._interval_s
                    )
                last_error = repr(error)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def follow(self, runner: ModelRunner) -> None:
        """Applies the deltas of ``runner``'s base that came since the last scan, in order."""
        with self._lock:
            while self._apply_next(runner):
                pass

    def _apply_next(self, runner: ModelRunner) -> bool:
        """Reads and verifies the deltas after the version ``runner`` serves, as many as are there in
        order, folds them into one (latest row wins) and applies that; False when there is none to apply
        now (none yet, refused, or vanished)."""
        base = self._base(runner)
        if base is None:
            return False
        deltas = deltas_of(self._dir, base.version)
        expected = next_sequence(runner.version)
        if expected not in deltas and any(s > expected for s in deltas):
            # A listing may miss a folder renamed into place while it ran (readdir leaves that open) and
            # still see a later one: look again before calling it a gap.
            deltas = deltas_of(self._dir, base.version)
        if expected not in deltas:
            later = sorted(s for s in deltas if s > expected)
            if later:
                path = deltas[later[0]]
                self._refuse(
                    path,
                    expected,
                    "sequence",
                    f"{path}: delta {later[0]} of base {base.version} comes after delta {expected}, which is "
                    f"not there; waiting for it (or a new base)",
                    runner,
                )
            return False
        from recserve.runtime.delta import fold_deltas

        read, stamps, sequence = [], [], expected
        while sequence in deltas:
            path = deltas[sequence]
            got = self._read(path, base, sequence, runner)
            if got is None:
                break
            read.append(got[0])
            stamps.append((path, got[1]))
            sequence += 1
        if not read:
            return False
        folded = fold_deltas(read)
        del read
        path, stamp = stamps[-1]
        try:
            # Prepared here, beside serving (overlays merged and indexed, dense converted); only the swap
            # runs in the runner's turn, and what it replaced is freed here, after the turn.
            prepared = runner.predictor.prepare_delta(folded)
            replaced = runner.between_batches(partial(runner.predictor.commit, prepared))
        except Exception as error:  # verified, yet the predictor would not take it: keep the last version
            self._refuse(path, expected, "apply", f"{path}: could not be applied ({error})", runner, stamp)
            return False
        del replaced, prepared
        self._metrics.deltas_applied.inc(len(stamps))
        self._metrics.model_state(runner.step, runner.wall_time)
        logger.debug(
            "applied %s (%d deltas): serving %s %s (step %s)",
            path,
            len(stamps),
            runner.schema.model_name,
            runner.version,
            runner.step,
        )
        return True

    def _read(self, path: Path, base: _Base, sequence: int, runner: ModelRunner):
        """``(verified delta, its stamp)``, or None when it was refused (counted once) or vanished."""
        stamp = files_stamp(path)
        if stamp is None or self._refused.get(path) == (stamp, sequence):
            return None
        from recserve.runtime.delta import read_delta

        try:
            return read_delta(path, base.manifest, base.manifest_sha256, sequence), stamp
        except (FileNotFoundError, PackageError) as error:
            if files_stamp(path) is None:
                return None  # retired while read: the next scan sees the new base
            if not isinstance(error, PackageError):
                raise
            self._refuse(path, sequence, _reason(path, base, sequence), str(error), runner, stamp)
            return None

    def _base(self, runner: ModelRunner) -> _Base | None:
        """``runner``'s base as its deltas must name it; None when its manifest is gone (retired)."""
        package_dir = runner.package_dir
        if package_dir is None:
            return None
        base = self._bases.get(package_dir)
        if base is None:
            from recserve.runtime import read_manifest
            from recserve.runtime.delta import deltas_dir, manifest_sha256

            try:
                manifest = read_manifest(package_dir)
                sha256 = manifest_sha256(package_dir)
            except (FileNotFoundError, PackageError):
                return None
            base = _Base(manifest.version, manifest.model_name, manifest, sha256)
            # Kept: this base and the one before it (one serves while the other loads); the refusals of
            # older bases' deltas are forgotten with them.
            kept = list(self._bases.items())[-1:] + [(package_dir, base)]
            self._bases = dict(kept)
            folders = {deltas_dir(self._dir, b.version) for b in self._bases.values()}
            self._refused = {p: r for p, r in self._refused.items() if p.parent in folders}
        return base

    def _refuse(
        self,
        path: Path,
        expected: int,
        reason: str,
        message: str,
        runner: ModelRunner,
        stamp: tuple | None = None,
    ) -> None:
        """Counts and logs a refusal once: not again while ``path``'s files and the expected delta stay."""
        stamp = files_stamp(path) if stamp is None else stamp
        if self._refused.get(path) == (stamp, expected):
            return
        self._refused[path] = (stamp, expected)
        self._metrics.deltas_refused.labels(reason).inc()
        logger.error(
            "delta refused (%s), still serving %s %s: %s",
            reason,
            runner.schema.model_name,
            runner.version,
            message,
        )


def _reason(path: Path, base: _Base, expected: int) -> str:
    """Why ``read_delta`` refused ``path`` in the words of ``recserve_model_deltas_refused_total``: it names
    another base ("base"), another sequence ("sequence"), or is malformed or corrupt ("invalid")."""
    try:
        doc = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return "invalid"
    if not isinstance(doc, dict):
        return "invalid"
    if (
        doc.get("base_version") != base.version
        or doc.get("base_manifest_sha256") != base.manifest_sha256
        or doc.get("model_name") != base.model_name
    ):
        return "base"
    if doc.get("sequence") != expected:
        return "sequence"
    return "invalid"
