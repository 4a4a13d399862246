"""Which CPU fused embedding backward a collection runs, and why, as one record a run can keep.

Two kernels update SGD / Adagrad / row-wise Adagrad tables on CPU: FBGEMM's and ours, compiled with numba
(``rectrain.embedding.native_backward``). ``FusedOptimizerConfig.cpu_backward`` forces one; ``auto`` (the
default; ``RECTRAIN_CPU_BACKWARD`` may force one instead) takes ours wherever it compiles and passes its
self-check, FBGEMM's elsewhere.

Why a rule and not a timing calibration: on every CPU class measured ours was faster than FBGEMM's backward
or about as fast (within 5 %; once 6.5 %, before the L2 prefetch below) in ``bench/embedding_bag.py`` (8 x
100k x 64 tables, batch 2048, row-wise Adagrad; docs/benchmarks.md names each machine):
- Intel Xeon with AVX-512 + AVX512-BF16 + AMX (family 6 model 167), 2 cores: raw FBGEMM 134 ms per step,
  ours 29 ms (issue 34);
- Intel Xeon @ 2.8 GHz with AVX-512, no AMX, quiet: FBGEMM 43.6 ms, ours 45.4 ms (4 % slower);
- AMD EPYC with AVX2: FBGEMM's backward 105 ms of a 116 ms step, most of it a serial CSR->CSC conversion
  per table that ours does not have (issue 13);
- AMD EPYC (Zen 4, family 25 model 17) with AVX-512 + AVX512-BF16, 2 cores shared with other jobs: at one
  thread (each rank of two) 0.96-1.08x FBGEMM's fused step since ours prefetches into L2 (1.34-1.52x
  before); at two threads 0.16-0.6x as load came and went (FBGEMM's OpenMP threads spin while a core is
  taken: 240-310 ms of CPU per step against ours 43-46 ms), and 1.065x in one quieter run before the L2
  prefetch.
FBGEMM's step also varies several-fold between runs on one class (raw FBGEMM 15.6 ms on the AMX machine of
docs/benchmarks.md, 134 ms on issue 34's).
A calibration at start would largely measure the load of that moment, and make a run's kernel, and so its
bits, depend on it; the rule gives the same kernel for a given machine and config every time. A class on
which FBGEMM is measured clearly faster would belong here as an exception.

Under ``torch.distributed``, ``DistributedModelParallel`` makes every rank run rank 0's choice
(``rectrain.distributed.parallel.backward_agreement``), so one run never mixes kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import asdict, dataclass

import torch

from rectrain.embedding.config import EmbOptimType, FusedOptimizerConfig
from rectrain.embedding.cpu_backward_runner import compiled_ready
from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)
ENV_VAR = "RECTRAIN_CPU_BACKWARD"
KERNELS = ("fbgemm", "native")
NATIVE_OPTIMIZERS = (EmbOptimType.SGD, EmbOptimType.ADAGRAD, EmbOptimType.ROWWISE_ADAGRAD)


@dataclass(frozen=True)
class BackwardChoice:
    """The kernel that updates the tables in backward (``"native"`` or ``"fbgemm"``) and why, in one line."""

    kernel: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def auto_choice() -> BackwardChoice:
    """What ``cpu_backward="auto"`` means in this process (``RECTRAIN_CPU_BACKWARD`` may force a kernel)."""
    forced = os.environ.get(ENV_VAR, "auto").lower()
    if forced not in ("auto", *KERNELS):
        raise ConfigError(f"{ENV_VAR} must be auto, fbgemm or native; got {forced!r}")
    if forced != "auto":
        return BackwardChoice(forced, f"{ENV_VAR}={forced}")
    if not compiled_ready():
        return BackwardChoice(
            "fbgemm", "auto: the compiled kernel cannot run here (numba missing or failed its self-check)"
        )
    return BackwardChoice(
        "native",
        "auto: the compiled kernel runs here; on every CPU class measured it was faster than FBGEMM's or "
        "about as fast (rectrain/embedding/backward_choice.py)",
    )


def cpu_backward_choice(
    config: FusedOptimizerConfig, device: torch.device, auto: BackwardChoice | None = None
) -> BackwardChoice:
    """The kernel fp32 tables with ``config``'s optimizer train with on ``device``, and why; ``auto`` is
    what ``cpu_backward="auto"`` means (default: this process's ``auto_choice()``)."""
    if device.type != "cpu":
        return BackwardChoice("fbgemm", f"{device.type}: FBGEMM's fused kernels")
    if config.optimizer is EmbOptimType.ADAM:
        return BackwardChoice(
            "native", "adam: FBGEMM's CPU build has no fused Adam; the compiled sparse Adam"
        )
    if config.weight_decay:
        # FBGEMM's CPU SGD and Adagrad ignore weight decay and its row-wise Adagrad applies its own variant;
        # staying on FBGEMM keeps both kernels' results interchangeable.
        return BackwardChoice("fbgemm", "weight_decay is set: FBGEMM's backward keeps its own handling of it")
    if config.cpu_backward != "auto":
        return BackwardChoice(config.cpu_backward, f"cpu_backward={config.cpu_backward!r} in the config")
    return auto or auto_choice()


def resolved(config: FusedOptimizerConfig, auto: BackwardChoice | None) -> FusedOptimizerConfig:
    """``config`` with ``cpu_backward="auto"`` replaced by ``auto``'s kernel (unchanged without one)."""
    if auto is None or config.cpu_backward != "auto":
        return config
    return dataclasses.replace(config, cpu_backward=auto.kernel)


@functools.cache
def log_choice(choice: BackwardChoice) -> None:
    """Log a choice once per process (every collection asks; the answer is the same)."""
    logger.info("CPU fused embedding backward: %s (%s)", choice.kernel, choice.reason)
