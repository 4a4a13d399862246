"""TorchRec's awaitables (``torchrec.distributed.types.Awaitable``, ``NoWait``, ``LazyAwaitable``).

rectrain's own collectives hand back a flat ``Pending``; these are for code written against TorchRec's
sharded-module protocol, whose stages return awaitables. ``wait()`` runs ``_wait_impl`` once and then the
callbacks in order. A ``LazyAwaitable`` waits by itself when its result is needed: passed to a torch function,
indexed, or asked for an attribute its result has.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch
import torch.fx

W = TypeVar("W")
KT = TypeVar("KT")
VT = TypeVar("VT")


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


class _LazyAwaitableMeta(abc.ABCMeta, torch.fx._symbolic_trace.ProxyableClassMeta):
    """Building a lazy awaitable under ``torch.fx`` tracing is one graph node (TorchRec's ``NeedWait``
    nodes), so a traced module waits where its eager form would."""


class LazyAwaitable(Awaitable[W], metaclass=_LazyAwaitableMeta):
    """An awaitable that waits (once) only when its result is used: passed to a torch function, in an
    operator (TorchRec installs torch.fx's magic methods, and so does this class), or asked for an attribute
    of its result. ``_result`` is None until then, as in TorchRec."""

    def __init__(self) -> None:
        super().__init__()
        self._result: W | None = None

    def wait(self) -> W:
        if self._result is None:
            self._result = super().wait()
        return self._result

    @staticmethod
    def _wait_async(value: Any) -> Any:
        return value.wait() if isinstance(value, LazyAwaitable) else value

    @classmethod
    def __torch_function__(cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None):
        args = torch.fx.node.map_aggregate(args, LazyAwaitable._wait_async)
        kwargs = torch.fx.node.map_aggregate(kwargs or {}, LazyAwaitable._wait_async)
        return func(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_result":
            raise RuntimeError(
                f"LazyAwaitable type {type(self)} has not been initialized properly, "
                "did you forget to call 'super()'?"
            )
        if name.startswith("__") or name == "_callbacks":  # copy/pickle probes, never the result's
            raise AttributeError(name)
        return getattr(self.wait(), name)


def _install_operators() -> None:
    # The operators torch.fx proxies (TorchRec's LazyAwaitable has the same set): each waits its operands.
    def binary(method: str) -> Callable:
        def impl(*args: Any) -> Any:
            return getattr(operator, method)(*(LazyAwaitable._wait_async(a) for a in args))

        return impl

    def reflected(method: str) -> Callable:
        def impl(self: Any, other: Any) -> Any:
            return getattr(operator, method)(LazyAwaitable._wait_async(other), self.wait())

        return impl

    for name in torch.fx.graph.magic_methods:
        setattr(LazyAwaitable, f"__{name}__", binary(name))
    for name in torch.fx.graph.reflectable_magic_methods:
        setattr(LazyAwaitable, f"__r{name}__", reflected(name))


_install_operators()


class LazyNoWait(LazyAwaitable[W]):
    """A lazy awaitable of a value already at hand."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


class LazyGetItemMixin(Generic[KT, VT]):
    """Put before ``LazyAwaitable`` in the bases: ``awaitable[key]`` is another lazy awaitable, so indexing
    does not wait."""

    def __getitem__(self, key: KT) -> LazyAwaitable[VT]:
        return GetItemLazyAwaitable(self, key)


class GetItemLazyAwaitable(LazyAwaitable[W]):
    """``parent[key]``, waiting on the parent when its own value is needed."""

    def __init__(self, parent: LazyAwaitable, key: Any) -> None:
        super().__init__()
        self._parent, self._key = parent, key

    def _wait_impl(self) -> W:
        return self._parent.wait()[self._key]


__all__ = ["Awaitable", "GetItemLazyAwaitable", "LazyAwaitable", "LazyGetItemMixin", "LazyNoWait", "NoWait"]
