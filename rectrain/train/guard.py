"""Stop a run that diverged, before it saves the diverged state.

Two signs, checked at the points where the loop already has the number: a training loss that is NaN or
infinite (every step; one tiny all-reduce so every rank stops at the same step), and a held-out AUC that fell
back to chance (``|auc - 0.5| < collapse_margin``) after an evaluation had shown the model learning (AUC at
least ``0.5 + learned_margin``), or a held-out AUC at chance with a normalized entropy above ``ne_limit``: the
predictions are confidently wrong, worse than the click rate alone (a rate ten times too high does this
from the first steps, without a NaN). Each raises ``TrainingDiverged`` naming the step and the fix; the caller
then skips its checkpoint, so the last checkpoint on disk is the last good one.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from rectrain.errors import TrainingDiverged
from rectrain.train.sync import RankAgreement

logger = logging.getLogger(__name__)

_FIX = "lower optimizer.sparse_lr / optimizer.dense_lr (or add warm-up: optimizer.warmup_steps)"


class DivergenceGuard:
    """``check_loss`` after every step, ``check_eval`` after every evaluation; both raise on divergence."""

    def __init__(
        self,
        agreement: RankAgreement,
        *,
        last_good_step: int | None = None,
        learned_margin: float = 0.05,
        collapse_margin: float = 0.01,
        ne_limit: float = 1.5,
    ) -> None:
        self._agreement = agreement
        self.last_good_step = last_good_step
        self.learned_margin, self.collapse_margin = learned_margin, collapse_margin
        # A model with no signal to find predicts about the click rate (NE near 1); far above 1 it is broken.
        self.ne_limit = ne_limit
        self._best_auc: float | None = None
        # None: defer the loss check where the loss is on a GPU (see check_loss); True/False force it.
        self.deferred: bool | None = None
        self._unread: list[tuple[int, Tensor]] = []

    def check_loss(self, step: int, loss: Tensor, settle: bool = True) -> None:
        """Raise if ``loss`` (this rank's) or any other rank's loss at ``step`` is not finite.

        A loss on a GPU is not read back at every step (that would make the host wait for the GPU each
        step): its finiteness is kept on the device and read when ``settle`` is true (the loop passes it at
        its logging steps, and before every evaluation and checkpoint, the same steps on every rank)."""
        deferred = loss.is_cuda if self.deferred is None else self.deferred
        if deferred:
            self._unread.append((step, torch.isfinite(loss.detach()).all()))
            if settle:
                self.settle()
            return
        finite = bool(torch.isfinite(loss.detach()).all())
        if self._agreement.any_rank(not finite):
            value = "not finite on another rank" if finite else f"{float(loss.detach().float().sum())}"
            self._raise(step, f"training loss is {value}")

    def settle(self) -> None:
        """Read the finiteness of the losses not read yet (one read for all of them) and raise for the first
        step whose loss was not finite on some rank; a no-op when all were read."""
        if not self._unread:
            return
        steps = [step for step, _ in self._unread]
        finite = torch.stack([flag for _, flag in self._unread]).tolist()
        self._unread.clear()
        first_bad = next((step for step, ok in zip(steps, finite) if not ok), 0)
        # The earliest bad step of any rank: every rank raises naming the same step.
        first = self._agreement.most(-first_bad if first_bad else -(steps[-1] + 1))
        if -first <= steps[-1]:
            where = "" if first_bad == -first else " on another rank"
            self._raise(-first, f"training loss is not finite{where}")

    def check_eval(self, step: int, metrics: dict[str, float]) -> None:
        """Raise if the held-out AUC is NaN, or back at chance after an evaluation above it."""
        auc = metrics.get("auc")
        if auc is None:
            return
        if not math.isfinite(auc):
            if _undefined_auc(step, metrics):
                return
            self._raise(step, f"held-out AUC is {auc}")
        learned = self._best_auc is not None and self._best_auc >= 0.5 + self.learned_margin
        at_chance = abs(auc - 0.5) < self.collapse_margin
        if learned and at_chance:
            self._raise(step, f"held-out AUC collapsed to {auc:.4f} (it was {self._best_auc:.4f})")
        ne = metrics.get("ne")
        if at_chance and ne is not None and ne > self.ne_limit:
            self._raise(
                step, f"held-out AUC is {auc:.4f} and NE {ne:.2f} (worse than predicting the click rate)"
            )
        if at_chance:  # never learned: a rate too high from the start looks like this (or labels are noise)
            logger.warning(
                "held-out AUC is %.4f at step %d: the model is not learning; if the data has signal, %s",
                auc,
                step,
                _FIX,
            )
        self._best_auc = auc if self._best_auc is None else max(self._best_auc, auc)

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` was written (the one kept if the run diverges later)."""
        self.last_good_step = step

    def _raise(self, step: int, what: str) -> None:
        kept = (
            f"the last good checkpoint (step {self.last_good_step}) is kept"
            if self.last_good_step is not None
            else "nothing was saved"
        )
        raise TrainingDiverged(f"training diverged at step {step}: {what}; {kept}. Fix: {_FIX}")


def _undefined_auc(step: int, metrics: dict[str, float]) -> bool:
    """A NaN AUC with no held-out rows, or with a finite loss (the held-out labels are all one class), says
    nothing about divergence: warn instead of advising a lower learning rate."""
    rows = metrics.get("num_examples")
    if rows is None or (rows and not math.isfinite(metrics.get("log_loss", math.nan))):
        return False
    why = (
        "no held-out rows: the data has fewer than data.holdout_every blocks of train.batch_size rows, or "
        "data.eval_paths is empty; give data.eval_paths"
        if not rows
        else "the held-out labels are all one class"
    )
    logger.warning("held-out AUC at step %d is undefined (%s)", step, why)
    return True
