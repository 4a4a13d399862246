"""``torchrec.distributed.fbgemm_qcomm_codec`` at rectrain's path: the names, and quantized comms refused.

rectrain's collectives send fp32. A ``QCommsConfig`` asking for FP32 both ways changes nothing and gives no
registry (``None``, which every sharder accepts); any other precision is refused where the registry is made,
rather than silently sent in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, unique
from typing import Any

from rectrain.errors import ConfigError


@unique
class CommType(Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    MX4 = "mx4"

    def __str__(self) -> str:
        return self.value


@dataclass
class QCommsConfig:
    """The precisions TorchRec would quantize its all-to-all / reduce-scatter payloads to."""

    forward_precision: CommType = CommType.FP32
    backward_precision: CommType = CommType.FP32
    forward_loss_scale: float | None = None
    backward_loss_scale: float | None = None
    fp8_quantize_dim: int | None = None
    fp8_quantize_dim_bwd: int | None = None
    fp8_bwd_uses_143: bool | None = False
    mx4_quantize_dim: int | None = None
    mx4_quantize_dim_bwd: int | None = None


def get_qcomm_codecs_registry(
    qcomms_config: QCommsConfig, comm_ops: list[Any] | None = None, device: Any = None
) -> None:
    """None for an all-FP32 config; ConfigError for any quantized precision (rectrain sends fp32)."""
    quantized = {
        name: precision
        for name, precision in (
            ("forward_precision", qcomms_config.forward_precision),
            ("backward_precision", qcomms_config.backward_precision),
        )
        if CommType(precision) is not CommType.FP32
    }
    if quantized:
        raise ConfigError(
            f"QCommsConfig {', '.join(f'{k}={v}' for k, v in quantized.items())}: rectrain's collectives are "
            "not quantized; use CommType.FP32 (or no qcomm_codecs_registry)"
        )
    return None
