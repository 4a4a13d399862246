"""``torchrec.optim.test_utils`` at rectrain's path: a keyed optimizer whose step does nothing, for tests."""

from __future__ import annotations

from typing import Any

from rectrain.optim.keyed import KeyedOptimizer


class DummyKeyedOptimizer(KeyedOptimizer):
    """A ``KeyedOptimizer`` with a no-op ``step`` (for testing wrappers and state dicts)."""

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None
