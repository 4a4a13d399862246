"""One-dimensional searches the planner drives one probe at a time (TorchRec's ``BinarySearchPredicate`` and
``LuusJaakolaSearch``, e.g. for how much of a table a cache should hold): the caller evaluates each probe
and hands the result back to ``next``, which returns the next probe, or None when the search is done.
"""

from __future__ import annotations

import math

import torch


class BinarySearchPredicate:
    """The largest integer X in ``[A, B]`` for which a step predicate F(X) holds (F false at X: false
    above X), stopping once the range left is narrower than ``tolerance``."""

    def __init__(self, A: int, B: int, tolerance: int) -> None:
        self.left, self.right, self.tolerance = A, B, tolerance
        self.first = True

    def next(self, prior_result: bool) -> int | None:
        """The next X to probe given F of the last one (ignored on the first call)."""
        if self.right - self.left < self.tolerance:
            return None
        if self.first:
            self.first = False
            return self._mid()
        mid = self._mid()
        if prior_result:
            self.left = mid + 1
        else:
            self.right = mid - 1
        return None if self.right - self.left < self.tolerance else self._mid()

    def _mid(self) -> int:
        return self.left + (self.right - self.left) // 2


class LuusJaakolaSearch:
    """The minimum of a cost over ``[A, B]`` by Luus-Jaakola random search, clamped to the range: each probe
    is the best point so far plus a uniform step within ``d``; ``d`` shrinks by 5 % on every improvement.
    A boundary's cost is probed once (``left_cost`` gives the left one up front). Deterministic per ``seed``.
    """

    def __init__(
        self, A: float, B: float, max_iterations: int, seed: int = 42, left_cost: float | None = None
    ) -> None:
        self.left, self.right = A, B
        self.iteration, self.max_iterations = -1, max_iterations
        self.gen = torch.Generator()
        self.gen.manual_seed(seed)
        self.x: float = self.uniform(A, B)
        self.fx: float = 0.0
        self.y: float = math.nan
        self.fleft: float | None = left_cost
        self.fright: float | None = None
        self.d: float = B - A

    def shrink_right(self, B: float) -> None:
        """Everything from ``B`` up costs infinity: search ``[left, B]``."""
        self.right, self.fright = B, math.inf
        self.d = self.right - self.left
        self.x = self.clamp(self.x)

    def clamp(self, x: float) -> float:
        return self.left if x < self.left else self.right if x > self.right else x

    def uniform(self, A: float, B: float) -> float:
        return A + (B - A) * torch.rand(1, generator=self.gen, device="cpu").item()

    def next(self, fy: float) -> float | None:
        """The next probe given the cost of the last one (ignored on the first call); None when done."""
        self.iteration += 1
        if self.iteration == 0:
            return self.x
        if self.iteration == 1:
            self.fx = fy
        elif self.iteration == self.max_iterations:
            return None
        elif fy <= self.fx:
            self.x, self.fx = self.y, fy
            self.d *= 0.95
        if self.y == self.left:
            self.fleft = fy
        elif self.y == self.right:
            self.fright = fy
        while True:
            y = self.clamp(self.x + self.uniform(-self.d, self.d))
            known = (y == self.left and self.fleft is not None) or (
                y == self.right and self.fright is not None
            )
            if not known:
                self.y = y
                return y

    def best(self) -> tuple[float, float]:
        """The best point so far and its cost."""
        return self.x, self.fx
