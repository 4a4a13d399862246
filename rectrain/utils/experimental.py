"""``torchrec.utils.experimental``: mark a function or class experimental (one UserWarning, at first use)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any


def experimental(obj: Any, feature: str | None = None, since: str | None = None) -> Any:
    """``obj`` (a function, or a class whose constructor is wrapped) warning once, when first called, that
    ``feature`` (default: its name) may change or go without notice."""
    message = f"`{feature or obj.__name__}` is *experimental* and may change or be removed without notice."
    if since:
        message = f"[since {since}] {message}"

    @functools.lru_cache(maxsize=1)
    def warn_once() -> None:
        warnings.warn(message, UserWarning, stacklevel=3)

    def wrap(call: Callable) -> Callable:
        @functools.wraps(call)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn_once()
            return call(*args, **kwargs)

        return wrapper

    if isinstance(obj, type):
        obj.__init__ = wrap(obj.__init__)
        return obj
    return wrap(obj)


__all__ = ["experimental"]
