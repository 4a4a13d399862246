"""Test helpers with TorchRec's names (``torchrec.test_utils``), so TorchRec-style tests run unchanged."""

from __future__ import annotations

import functools
import os
import socket
import unittest
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def get_free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_asan() -> bool:
    """True in an AddressSanitizer build (these builds skip some heavy tests)."""
    return bool(os.environ.get("ASAN_OPTIONS"))


def is_tsan() -> bool:
    return bool(os.environ.get("TSAN_OPTIONS"))


def is_asan_or_tsan() -> bool:
    return is_asan() or is_tsan()


def skip_if_asan(func: Callable[..., T]) -> Callable[..., T | None]:
    """Skip the decorated test under a sanitizer."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        if is_asan_or_tsan():
            raise unittest.SkipTest("skipped under a sanitizer (ASAN/TSAN)")
        return func(*args, **kwargs)

    return wrapper


def skip_if_asan_class(cls: type) -> type:
    """Skip every test of the decorated class under a sanitizer."""
    if is_asan_or_tsan():
        cls.__unittest_skip__ = True
        cls.__unittest_skip_why__ = "skipped under a sanitizer (ASAN/TSAN)"
    return cls


def cuda_device_count() -> int:
    return torch.cuda.device_count()
