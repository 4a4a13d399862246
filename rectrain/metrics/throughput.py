"""``ThroughputMetric`` (TorchRec's ``metrics.throughput``): examples trained per second by all ranks.

Each ``update`` is one trained batch of ``batch_size`` per rank (or the current ``BatchSizeStage``'s). The
first ``warmup_steps`` batches are not timed; lifetime throughput is the examples since then over the time
since then, window throughput the same over the latest ``window_seconds``, and the ``attempt_`` values
count this process only (not restored from a checkpoint).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import deque
from typing import Any

import torch
from torch import Tensor, nn

from rectrain.metrics.metrics_config import BatchSizeStage
from rectrain.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix, compose_metric_key

MAX_WINDOW_TS: int = 2 * 60 * 60  # a window longer than two hours is stale

logger = logging.getLogger(__name__)


class ThroughputMetric(nn.Module):
    _namespace = MetricNamespace.THROUGHPUT
    _metric_name = MetricName.THROUGHPUT

    def __init__(
        self,
        *,
        batch_size: int,
        world_size: int,
        window_seconds: int,
        warmup_steps: int = 100,
        batch_size_stages: list[BatchSizeStage] | None = None,
    ) -> None:
        super().__init__()
        if window_seconds < 1:
            raise ValueError(
                "window_seconds must be at least 1 to give window throughput the minimum time window"
            )
        if warmup_steps < 1:
            raise ValueError("warmup_steps must be at least 1 to give throughput a reasonable begin time.")
        if window_seconds > MAX_WINDOW_TS:
            logger.warning("window_seconds %d is over %d: capped", window_seconds, MAX_WINDOW_TS)
            window_seconds = MAX_WINDOW_TS
        self._batch_size = batch_size
        self._world_size = world_size
        self._window_seconds = window_seconds
        self._warmup_steps = warmup_steps
        self._batch_size_stages = copy.deepcopy(batch_size_stages)
        if batch_size_stages is not None:
            self._num_batch = 0  # only a staged batch size counts batches (and checkpoints the count)
        self._register_load_state_dict_pre_hook(self.load_state_dict_hook)
        self.register_state_dict_post_hook(self.state_dict_hook)
        for name, dtype, persistent in [
            ("total_examples", torch.long, True),
            ("warmup_examples", torch.long, True),
            ("time_lapse_after_warmup", torch.double, True),
            ("attempt_examples", torch.long, False),
            ("attempt_warmup_examples", torch.long, False),
            ("attempt_time_lapse_after_warmup", torch.double, False),
        ]:
            self.register_buffer(name, torch.tensor(0, dtype=dtype), persistent=persistent)
        self._window_time_lapse_buffer: deque[float] = deque(maxlen=MAX_WINDOW_TS)
        self._window_time_lapse = 0.0
        self._previous_ts = 0.0
        self._steps = 0
        key = lambda name, prefix=MetricPrefix.DEFAULT: compose_metric_key(  # noqa: E731
            self._namespace, str(self._namespace), name, prefix
        )
        self._lifetime_throughput_key = key(self._metric_name, MetricPrefix.LIFETIME)
        self._window_throughput_key = key(self._metric_name, MetricPrefix.WINDOW)
        self._attempt_throughput_key = key(self._metric_name, MetricPrefix.ATTEMPT)
        self._total_examples_key = key(MetricName.TOTAL_EXAMPLES)
        self._attempt_examples_key = key(MetricName.ATTEMPT_EXAMPLES)
        self._batch_size_key = key(MetricName.BATCH_SIZE)

    def set_num_batch(self, num_batch: int) -> None:
        if self._batch_size_stages is not None:
            self._num_batch = num_batch

    def _get_batch_size(self) -> int:
        """The batch size of the stage that the current batch count is in (stages passed are dropped)."""
        stages = self._batch_size_stages
        if not stages:
            return self._batch_size
        while stages[0].max_iters is not None and stages[0].max_iters < self._num_batch:
            stages.pop(0)
        return stages[0].batch_size

    def _batch_examples(self) -> int:
        return self._get_batch_size() * self._world_size

    def update(self) -> None:
        """One batch trained (by every rank)."""
        ts = time.monotonic()
        self._steps += 1
        if self._batch_size_stages is not None:
            self._num_batch += 1
        examples = self._batch_examples()
        self.total_examples += examples
        self.attempt_examples += examples
        if self._steps <= self._warmup_steps:
            self.warmup_examples += examples
            self.attempt_warmup_examples += examples
            if self._steps == self._warmup_steps:
                self._previous_ts = ts
            return
        lapse = ts - self._previous_ts
        self.time_lapse_after_warmup += lapse
        self.attempt_time_lapse_after_warmup += lapse
        self._window_time_lapse += lapse
        self._window_time_lapse_buffer.append(lapse)
        while self._window_time_lapse > self._window_seconds:
            self._window_time_lapse -= self._window_time_lapse_buffer.popleft()
        self._previous_ts = ts

    def compute(self) -> dict[str, Tensor]:
        ret = {
            self._total_examples_key: self.total_examples,
            self._attempt_examples_key: self.attempt_examples,
        }
        if self._steps > self._warmup_steps and not math.isclose(self.time_lapse_after_warmup.item(), 0):
            lifetime = (self.total_examples - self.warmup_examples) / self.time_lapse_after_warmup
            attempt = (
                self.attempt_examples - self.attempt_warmup_examples
            ) / self.attempt_time_lapse_after_warmup
            window = 0.0
            if not math.isclose(self._window_time_lapse, 0):
                window = (
                    len(self._window_time_lapse_buffer) * self._batch_examples() / self._window_time_lapse
                )
            if not math.isclose(lifetime.item(), 0):
                ret[self._lifetime_throughput_key] = lifetime.clone().detach()
                ret[self._window_throughput_key] = torch.tensor(window, dtype=torch.double)
            if not math.isclose(attempt.item(), 0):
                ret[self._attempt_throughput_key] = attempt.clone().detach()
        if self._batch_size_stages is not None:
            ret[self._batch_size_key] = torch.tensor(self._get_batch_size(), dtype=torch.int32)
        return ret

    @staticmethod
    def state_dict_hook(
        module: nn.Module, state_dict: dict[str, Tensor], prefix: str, local_metadata: Any
    ) -> None:
        if module._batch_size_stages is not None:
            state_dict[f"{prefix}num_batch"] = torch.tensor(module._num_batch, dtype=torch.long)

    def load_state_dict_hook(self, state_dict: dict[str, Tensor], prefix: str, *args: Any) -> None:
        num_batch = state_dict.pop(f"{prefix}num_batch", None)
        if num_batch is not None and self._batch_size_stages is not None:
            self._num_batch = int(num_batch.item())
