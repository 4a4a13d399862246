"""Collective timeouts that name the culprit: which rank did not arrive, in which collective.

Every process group gets the job's timeout (``init_from_env(timeout=...)``; ``new_group`` here passes it on,
since ``torch.distributed.new_group`` would otherwise fall back to 30 minutes). When a collective fails by
timing out or losing a peer, gloo says only "Timed out waiting 5000ms for recv" or "Connection closed by
peer". ``collective(name, group)`` turns that into a ``CollectiveTimeoutError`` naming the ranks that never
reached it: each rank that failed writes a key into the job's store (which lives outside the hung ranks in a
torchrun job: the agent hosts it), waits a short grace period for the other ranks of the group to do the
same, and reports the ranks whose key is missing, that is, the ranks still stuck elsewhere or dead.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from rectrain.errors import RecTrainError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = timedelta(minutes=10)
_FALLBACK = timedelta(minutes=30)  # torch's own default, when a group's timeout cannot be read
# How long a failed rank waits for the others to report in. Ranks waiting on a stuck one time out within the
# skew of their entry into the collective; a dead peer's sockets close for all its peers at once.
_TIMEOUT_GRACE_S = 10.0
_LOST_PEER_GRACE_S = 3.0
_PEER_LOST = ("timed out", "timeout", "connection closed", "connection reset", "pair closure", "broken pipe")
_reports = itertools.count()  # the n-th failure of this process uses the n-th set of store keys


class CollectiveTimeoutError(RecTrainError):
    """A collective timed out or lost a peer; the message names the collective and the missing ranks."""

    def __init__(self, message: str, collective: str, missing: list[int] | None) -> None:
        super().__init__(message)
        self.collective, self.missing = collective, missing


def group_timeout(group: dist.ProcessGroup | None = None) -> timedelta:
    """The timeout of ``group``'s backend (the default group's when None)."""
    pg = group or dist.group.WORLD
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return _FALLBACK


def new_group(
    ranks: Sequence[int] | None = None, backend: str | None = None, timeout: timedelta | None = None
) -> dist.ProcessGroup:
    """``dist.new_group`` with the default group's timeout unless one is given (collective on every rank)."""
    return dist.new_group(
        list(ranks) if ranks is not None else None, timeout=timeout or group_timeout(), backend=backend
    )


def _lost_peer(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in _PEER_LOST)


@contextlib.contextmanager
def collective(name: str, group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """Run a collective (or wait on one); a timeout or a lost peer becomes ``CollectiveTimeoutError``."""
    try:
        yield
    except RuntimeError as e:
        if not _lost_peer(e) or not dist.is_initialized():
            raise
        raise diagnose(name, group, e) from e


def diagnose(name: str, group: dist.ProcessGroup | None, error: BaseException) -> CollectiveTimeoutError:
    """Find the ranks of ``group`` that did not reach a failed collective (see the module doc)."""
    timeout = group_timeout(group)
    me = dist.get_rank()
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    grace = _TIMEOUT_GRACE_S if "timed out" in str(error).lower() else _LOST_PEER_GRACE_S
    missing = _missing_ranks(ranks, me, name, min(timeout.total_seconds(), grace))
    cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if missing is None:
        who = "could not ask the store which ranks are stuck"
    elif missing:
        names = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        who = f"{names} did not reach it (hung or dead)"
    else:
        who = "every rank of the group reached it (a network or backend failure, not a stuck rank)"
    message = (
        f"collective {name} failed on rank {me} (timeout {timeout.total_seconds():g} s): {who}; "
        f"backend said: {cause}"
    )
    logger.error("%s", message)
    return CollectiveTimeoutError(message, name, missing)


def _missing_ranks(ranks: list[int], me: int, name: str, grace_s: float) -> list[int] | None:
    """Ranks that have not written their report key within ``grace_s``; None if the store cannot be used."""
    try:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"rectrain/stuck/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_reports)}/"
        store.set_timeout(timedelta(seconds=max(1.0, grace_s)))
        store.set(f"{prefix}{me}", name)
        deadline = time.monotonic() + grace_s
        while True:
            arrived = {r for r in ranks if store.check([f"{prefix}{r}"])}
            if len(arrived) == len(ranks) or time.monotonic() >= deadline:
                return sorted(set(ranks) - arrived)
            time.sleep(0.1)
    except Exception as e:  # the store's host may be the stuck rank itself
        logger.warning("collective %s: cannot check which ranks are stuck: %s", name, e)
        return None
