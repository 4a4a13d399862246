"""DataLoader workers of a training run: started from a fork server, never forked from the trainer."""

from __future__ import annotations

import os

import torch
from torch.utils.data import IterableDataset

from rectrain.train.data import _loader


class _ParentPid(IterableDataset):
    """Yields the pid of the process that started the worker reading it."""

    def __iter__(self):
        yield torch.tensor([os.getppid()])


def test_workers_do_not_share_the_training_process_memory():
    # A worker forked from the trainer shares the model's tables copy-on-write: every page an optimizer step
    # writes first after the fork is copied at a page fault. A fork server's children share none of it.
    parents = [int(t) for t in _loader(_ParentPid(), num_workers=2, prefetch=2)]
    assert len(parents) == 2
    assert os.getpid() not in parents
