"""The online mode's data: Criteo files arriving in ``OUT/stream`` with a planted change; the probe's rows.

Every file is one part of the same hidden task (``SyntheticCriteoSpec.part``); from file ``change_at_file`` on
the rows holding a planted token (``PLANTED``: a few frequent tokens of columns 0 and 1) get
``planted_boost`` added to their logit, so those ids click far more than before. The probe's rows are drawn
from the task too (a part no file has) and written twice: with the planted tokens in the planted columns,
and with control tokens of about the same frequency (``CONTROL_RANKS``) there instead; the two halves differ
only in those ids, so their served scores differ only by what the model learned about them.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from recserve.mainjob.config import CONTROL_RANKS, PLANTED, MainJobConfig, MainJobError
from rectrain.datasets import SyntheticCriteoSpec, synthetic_criteo_token, write_synthetic_criteo
from rectrain.datasets.criteo import NUM_DENSE

logger = logging.getLogger(__name__)


def stream_spec(cfg: MainJobConfig, index: int) -> SyntheticCriteoSpec:
    """File ``index``'s rows: part ``index + 1`` of the task, planted from ``change_at_file`` on."""
    changed = index >= cfg.change_at_file
    return SyntheticCriteoSpec(
        num_rows=cfg.rows_per_file,
        vocab_size=cfg.vocab_size,
        seed=cfg.seed,
        part=index + 1,
        planted=PLANTED if changed else (),
        planted_boost=cfg.planted_boost if changed else 0.0,
    )


def file_name(index: int) -> str:
    """Names sort in arrival order (the follower reads files in name order)."""
    return f"part-{index:05d}.tsv"


def write_probe_file(cfg: MainJobConfig, path: Path) -> Path:
    """``probe_rows`` rows with the planted tokens, then the same rows with control tokens (one TSV)."""
    # part files + 1: rows no arriving file has
    spec = SyntheticCriteoSpec(
        num_rows=cfg.probe_rows, vocab_size=cfg.vocab_size, seed=cfg.seed, part=cfg.files + 1
    )
    source = write_synthetic_criteo(path.with_name(f".{path.name}.rows"), spec)
    rows = [line.rstrip("\n").split("\t") for line in source.read_text().splitlines()]
    source.unlink()
    ranks: dict[int, list[int]] = {}
    for column, rank in PLANTED:
        ranks.setdefault(column, []).append(rank)
    planted = {c: [synthetic_criteo_token(spec, c, r) for r in rs] for c, rs in ranks.items()}
    control = {c: [synthetic_criteo_token(spec, c, r) for r in CONTROL_RANKS] for c in ranks}
    lines = []
    for tokens in (planted, control):
        for j, row in enumerate(rows):
            row = list(row)
            for column, choices in tokens.items():  # every row, each of the planted columns' ids in turn
                row[1 + NUM_DENSE + column] = choices[(j + column) % len(choices)]
            lines.append("\t".join(row) + "\n")
    path.write_text("".join(lines))
    return path


class StreamWriter:
    """A thread that renames the next file into ``stream`` every ``file_interval_s``.

    Files are written under a dot-name in the directory and renamed in (``write_synthetic_criteo``), so the
    trainer never reads a partial one. The change file waits for ``before_change`` (the job sets it once the
    probe has scored the model as it was before the change) for at most ``gate_timeout_s``. ``arrivals``
    holds each file's rename time (unix seconds); ``change_time`` the change file's.
    """

    def __init__(
        self, cfg: MainJobConfig, stream: Path, before_change: threading.Event, gate_timeout_s: float
    ) -> None:
        self.cfg = cfg
        self.stream = stream
        self.before_change = before_change
        self.gate_timeout_s = gate_timeout_s
        self.arrivals: list[float] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-writer", daemon=True)

    @property
    def change_time(self) -> float | None:
        index = self.cfg.change_at_file
        return self.arrivals[index] if len(self.arrivals) > index else None

    def __enter__(self) -> StreamWriter:
        self.stream.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def join(self, timeout_s: float) -> None:
        """Wait until every file has arrived; raise ``MainJobError`` if writing failed or took too long."""
        self._thread.join(timeout_s)
        if self.error is not None:
            raise MainJobError(f"stage 'stream': writing {self.stream} failed: {self.error}") from self.error
        if self._thread.is_alive():
            raise MainJobError(
                f"stage 'stream': {len(self.arrivals)} of {self.cfg.files} files arrived in {timeout_s:.0f} s"
            )

    def _run(self) -> None:
        try:
            due = time.monotonic()
            for index in range(self.cfg.files):
                if index == self.cfg.change_at_file:
                    if not self._wait_for_probe():
                        return
                    due = max(due, time.monotonic())
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    return
                write_synthetic_criteo(self.stream / file_name(index), stream_spec(self.cfg, index))
                self.arrivals.append(time.time())
                logger.info("stream: %s arrived", file_name(index))
                due += self.cfg.file_interval_s
        except BaseException as e:  # noqa: BLE001 - reported by join()
            self.error = e

    def _wait_for_probe(self) -> bool:
        deadline = time.monotonic() + self.gate_timeout_s
        while not self.before_change.wait(0.1):
            if self._stop.is_set():
                return False
            if time.monotonic() > deadline:
                raise MainJobError(
                    f"the probe scored nothing in {self.gate_timeout_s:.0f} s, so the change (file "
                    f"{self.cfg.change_at_file}) would have no 'before'; see logs/serve.log"
                )
        return True
