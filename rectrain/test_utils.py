"""Test helpers with TorchRec's names (``torchrec.test_utils``), so TorchRec-style tests run unchanged."""

from __future__ import annotations

import functools
import os
import random
import socket
import time
import unittest
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

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


def init_distributed_single_host(
    rank: int, world_size: int, backend: str, local_size: int | None = None
) -> dist.ProcessGroup:
    """This process as ``rank`` of a one-host group (``MASTER_ADDR``/``MASTER_PORT`` from the environment);
    a group already initialised in this process is replaced."""
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size or world_size)
    os.environ["LOCAL_RANK"] = str(rank % local_size if local_size else rank)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(rank=rank, world_size=world_size, backend=backend)
    return dist.group.WORLD


def seed_and_log(wrapped: Callable[..., T]) -> Callable[..., T]:
    """Seed torch and ``random`` from the clock before each call and print the seed (to rerun a failure)."""

    @functools.wraps(wrapped)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        seed = int(time.time() * 1000) % (1 << 31)
        print(f"Using random seed: {seed}")
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        return wrapped(*args, **kwargs)

    return wrapper
