"""``torchrec.distributed.utils`` at rectrain's path: ``none_throws``."""

from typing import TypeVar

_T = TypeVar("_T")


def none_throws(optional: _T | None, message: str = "Unexpected `None`") -> _T:
    """``optional``, or an ``AssertionError`` with ``message`` when it is None."""
    if optional is None:
        raise AssertionError(message)
    return optional
