"""The machine a benchmark ran on: CPU model and instruction-set class, printed by every script in bench/.

FBGEMM's kernels differ by class (AVX2 vs AVX-512), so a figure means little without it. An instruction-set
override (FBGEMM_ENABLE_INSTRUCTIONS=AVX2, ATEN_CPU_CAPABILITY=avx2) makes an AVX-512 machine run the AVX2
kernels; the line then says "emulated" so such figures are never mistaken for a real AVX2 machine's.
A benchmark that runs on a GPU passes its device, and the line names the GPU and the CUDA build as well.
"""

from __future__ import annotations

import os
import platform


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown CPU", platform.processor()):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def cpu_model() -> str:
    return _cpuinfo()[0]


def isa_class() -> str:
    """AVX-512 (with AMX / AVX512-BF16 named), AVX2 or other; "emulated AVX2" under an override."""
    _, flags = _cpuinfo()
    forced = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper()
    if "avx512f" in flags:
        if forced in ("AVX2", "AVX"):
            return "emulated AVX2 (AVX-512 CPU, FBGEMM_ENABLE_INSTRUCTIONS=AVX2)"
        extras = [
            name for flag, name in (("avx512_bf16", "AVX512-BF16"), ("amx_tile", "AMX")) if flag in flags
        ]
        return "AVX-512" + (f" (+{', '.join(extras)})" if extras else "")
    return "AVX2" if "avx2" in flags else "no AVX2"


def gpu_line(device: str) -> str:
    """The GPU behind ``device`` ("cuda" or "cuda:N"): name, memory, how many are visible, CUDA and torch."""
    import torch  # only GPU benchmarks pay for it here

    index = torch.device(device).index
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None else index)
    return (
        f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} visible), "
        f"CUDA {torch.version.cuda}, torch {torch.__version__}"
    )


def machine_line(device: str = "cpu") -> str:
    model, _ = _cpuinfo()
    line = f"machine: {model}, {os.cpu_count()} cores, ISA {isa_class()}"
    return f"{line}; {gpu_line(device)}" if str(device).startswith("cuda") else line


def print_machine(device: str = "cpu") -> None:
    print(machine_line(device), flush=True)
