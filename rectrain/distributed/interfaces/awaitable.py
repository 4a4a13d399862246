"""TorchRec's awaitables (``torchrec.distributed.types.Awaitable``, ``NoWait``, ``LazyAwaitable``).

rectrain's own collectives hand back a flat ``Pending``; these are for code written against TorchRec's
sharded-module protocol, whose stages return awaitables. ``wait()`` runs ``_wait_impl`` once and then the
callbacks in order. A ``LazyAwaitable`` waits by itself when its result is needed: passed to a torch function,
indexed, or asked for an attribute its result has.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Generic, TypeVar

W = TypeVar("W")
_NOT_READY = object()


class Awaitable(abc.ABC, Generic[W]):
    """A result that may still be in flight; subclasses implement ``_wait_impl``."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[W], W]] = []

    @abc.abstractmethod
    def _wait_impl(self) -> W: ...

    def wait(self) -> W:
        result = self._wait_impl()
        for callback in self._callbacks:
            result = callback(result)
        return result

    @property
    def callbacks(self) -> list[Callable[[W], W]]:
        """Functions applied to the result after ``_wait_impl``, in order."""
        return self._callbacks


class NoWait(Awaitable[W]):
    """An awaitable of a value already at hand."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


class LazyAwaitable(Awaitable[W]):
    """An awaitable that waits (once) only when its result is used."""

    def __init__(self) -> None:
        super().__init__()
        self._result: Any = _NOT_READY

    def wait(self) -> W:
        if self._result is _NOT_READY:
            self._result = super().wait()
        return self._result

    @staticmethod
    def _resolve(value: Any) -> Any:
        if isinstance(value, LazyAwaitable):
            return value.wait()
        if isinstance(value, (list, tuple)):
            return type(value)(LazyAwaitable._resolve(v) for v in value)
        if isinstance(value, dict):
            return {k: LazyAwaitable._resolve(v) for k, v in value.items()}
        return value

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None):
        return func(*cls._resolve(args), **cls._resolve(kwargs or {}))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # own state not set yet (during __init__), never the result's
            raise AttributeError(name)
        return getattr(self.wait(), name)

    def __getitem__(self, key: Any) -> Any:
        return self.wait()[key]


__all__ = ["Awaitable", "LazyAwaitable", "NoWait"]
