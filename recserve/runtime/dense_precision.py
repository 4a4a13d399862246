"""The dtype a package's dense part runs in on this machine, decided once at load and logged (issue 37).

A package exported with an fp32 dense part runs it in bf16 where three things hold:

- the CPU computes bf16 natively (AVX512-BF16 or AMX; elsewhere oneDNN emulates it, slower than fp32);
- the package's accuracy gate allows it: export scores its accuracy sample with the package's tables and a
  bf16 dense part too and records, beside the package's own result, whether the AUC drop against fp32 stays
  within the export's ``max_auc_drop`` (``accuracy.dense_bf16.allowed``); a package exported before that
  records nothing and keeps fp32;
- nobody asked for fp32: ``Predictor.load(..., dense_dtype="fp32")``, ``recserve serve --dense-dtype fp32``
  or ``RECSERVE_DENSE_DTYPE=fp32`` (``bf16`` forces it wherever the gate allows, for measurements).

bf16 keeps fp32's exponent range, so scores move by rounding only (max |dlogit| is in the manifest). A
package exported with a bf16 or fp16 dense part runs as exported.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

logger = logging.getLogger(__name__)

# A manifest's dense_dtype -> the torch dtype the dense part is stored and runs in.
DENSE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

ENV = "RECSERVE_DENSE_DTYPE"
CHOICES = ("auto", "fp32", "bf16")
_NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic in hardware (AVX512-BF16 or AMX-BF16), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return any(flag in flags for flag in _NATIVE_FLAGS)
    except OSError:
        pass
    return False


def bf16_gate(accuracy: dict[str, Any] | None) -> tuple[bool, str]:
    """``(allowed, why)`` from a manifest's accuracy report."""
    gate = (accuracy or {}).get("dense_bf16")
    if not isinstance(gate, dict) or "allowed" not in gate:
        return False, "the package records no bf16 accuracy (exported before recserve measured it)"
    logit, auc = gate.get("max_abs_logit_diff", float("nan")), gate.get("auc_diff", 0.0)
    shown = f"max |dlogit| {logit:.2g}, AUC {auc:+.5f}"
    if not gate["allowed"]:
        return False, f"bf16 costs more AUC than the package's max_auc_drop ({shown})"
    return True, f"within the package's accuracy gate ({shown})"


def choose_dense_dtype(
    exported: str, accuracy: dict[str, Any] | None, device_type: str, requested: str | None = None
) -> tuple[str, str]:
    """``(dtype, reason)`` for the dense part: ``exported`` is the manifest's dense dtype, ``requested`` the
    caller's choice (None: ``$RECSERVE_DENSE_DTYPE``, else auto)."""
    requested = requested or os.environ.get(ENV, "auto") or "auto"
    if requested not in CHOICES:
        raise ValueError(f"dense dtype: expected one of {list(CHOICES)}, got {requested!r} ({ENV}?)")
    if exported != "fp32":
        return exported, f"exported as {exported}"
    if requested == "fp32":
        return "fp32", "fp32 asked for"
    if device_type != "cpu":
        return "fp32", f"bf16 by default only on CPU (device {device_type})"
    allowed, why = bf16_gate(accuracy)
    if not allowed:
        return "fp32", why
    if requested == "bf16":
        return "bf16", f"bf16 asked for, {why}"
    if not native_bf16():
        return "fp32", "this CPU has no native bf16 (AVX512-BF16 or AMX), where fp32 is faster"
    return "bf16", f"native bf16 on this CPU, {why}"
