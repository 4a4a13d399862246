"""A :class:`Topology` from three records, each value taken from the first that sets it (TorchRec's
``TopologyFactory`` and its configs): the trainer's overrides (:class:`TrainerConfig`), then what the hardware
reports (:class:`HardwareConfig`), then the defaults; :class:`KernelConfig` gives the compute device and the
perf multipliers. A dry run's capacities win over both; a trainer value far from the hardware's is logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rectrain.distributed.logger import static_logger
from rectrain.planner.topology import (
    BWD_COMPUTE_MULTIPLIER,
    WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER,
    GeneralizedCommsBandwidth,
    Topology,
)

_CAP_OVERRIDE_THRESHOLD = 0.05  # a trainer cap further than this from the detected one is logged


class TopologyConfigBase:
    """``additional_params``: values a framework passes through (e.g. ``custom_topology_data``)."""

    additional_params: dict[str, Any]

    def get_param(self, key: str, default: Any = None) -> Any:
        return self.additional_params.get(key, default)

    def has_param(self, key: str) -> bool:
        return key in self.additional_params


@dataclass(frozen=True)
class HardwareConfig(TopologyConfigBase):
    """What the hardware reports: capacities in bytes, bandwidths in bytes/ms (None: not detected)."""

    hbm_cap_bytes: int | None = None
    ddr_cap_bytes: int | None = None
    ssd_cap_bytes: int | None = None
    intra_host_bw: float | None = None
    inter_host_bw: float | None = None
    hbm_mem_bw: float | None = None
    ddr_mem_bw: float | None = None
    hbm_to_ddr_mem_bw: float | None = None
    ssd_mem_bw: float | None = None
    additional_params: dict[str, Any] = field(default_factory=dict)

    def get_validation_issues(self, compute_device: str | None = None) -> list[str]:
        """What is certainly wrong (a failed detection), one line each; HBM is checked on cuda/mtia only."""
        issues = []
        hbm = self.hbm_cap_bytes
        if hbm is not None and compute_device in ("cuda", "mtia") and hbm <= 0:
            issues.append(f"hbm_cap_bytes={hbm} is non-positive")
        if self.ddr_cap_bytes is not None and self.ddr_cap_bytes <= 0:
            issues.append(f"ddr_cap_bytes={self.ddr_cap_bytes} is non-positive")
        if self.ssd_cap_bytes is not None and self.ssd_cap_bytes < 0:
            issues.append(f"ssd_cap_bytes={self.ssd_cap_bytes} is negative")
        names = (
            "intra_host_bw",
            "inter_host_bw",
            "hbm_mem_bw",
            "ddr_mem_bw",
            "hbm_to_ddr_mem_bw",
            "ssd_mem_bw",
        )
        issues += [
            f"{n}={v} is non-positive" for n in names if (v := getattr(self, n)) is not None and v <= 0
        ]
        intra, inter = self.intra_host_bw, self.inter_host_bw
        if intra is not None and inter is not None and intra < inter:
            issues.append(
                f"intra_host_bw ({intra:.0f}) < inter_host_bw ({inter:.0f}); a host's links are faster"
            )
        return issues

    def validate(self, compute_device: str | None = None) -> None:
        """Logs the issues as one warning (a trainer value may still override a bad detection)."""
        issues = self.get_validation_issues(compute_device)
        if issues:
            static_logger.warning("HardwareConfig validation: " + "; ".join(issues))


@dataclass(frozen=True)
class TrainerConfig(TopologyConfigBase):
    """The trainer's geometry and overrides (capacities in bytes)."""

    world_size: int | None = None
    local_world_size: int | None = None
    hbm_cap_bytes: int | None = None
    ddr_cap_bytes: int | None = None
    ssd_cap_bytes: int | None = None
    is_dry_run: bool = False
    dry_run_hbm_bytes: int | None = None
    dry_run_ddr_bytes: int | None = None
    pod_size: int | None = None
    additional_params: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.world_size is None:
            raise ValueError("world_size must be provided in TrainerConfig")
        if self.pod_size is not None and self.pod_size > self.world_size:
            raise ValueError(
                f"pod_size ({self.pod_size}) cannot be greater than world_size ({self.world_size})"
            )


@dataclass(frozen=True)
class KernelConfig(TopologyConfigBase):
    """The compute device and the perf model's multipliers; ``use_hardware_based_bandwidth`` takes the
    bandwidths from the :class:`HardwareConfig`, ``generalized_comms_bandwidths`` replaces its comms ones."""

    compute_device: str = "cuda"
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    weighted_feature_bwd_compute_multiplier: float = WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
    uneven_sharding_perf_multiplier: float = 1.0
    use_hardware_based_bandwidth: bool = False
    generalized_comms_bandwidths: GeneralizedCommsBandwidth | None = None
    additional_params: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        devices = {"cuda", "mtia", "cpu"}
        if self.compute_device not in devices:
            raise ValueError(f"compute_device must be one of {devices}, got '{self.compute_device}'")


class TopologyFactory:
    @staticmethod
    def create_topology(
        trainer_config: TrainerConfig,
        hardware_config: HardwareConfig | None = None,
        kernel_config: KernelConfig | None = None,
    ) -> Topology:
        """The topology the three configs describe (see the module doc for which value wins)."""
        trainer, hardware, kernel = (
            trainer_config,
            hardware_config or HardwareConfig(),
            kernel_config or KernelConfig(),
        )
        trainer.validate()
        hardware.validate(compute_device=kernel.compute_device)
        kernel.validate()
        kwargs: dict[str, Any] = {
            "world_size": trainer.world_size,
            "compute_device": kernel.compute_device,
            "local_world_size": trainer.local_world_size,
            "pod_size": trainer.pod_size,
            "bwd_compute_multiplier": kernel.bwd_compute_multiplier,
            "weighted_feature_bwd_compute_multiplier": kernel.weighted_feature_bwd_compute_multiplier,
            "uneven_sharding_perf_multiplier": kernel.uneven_sharding_perf_multiplier,
            "custom_topology_data": trainer.get_param("custom_topology_data"),
            "generalized_comms_bandwidths": kernel.generalized_comms_bandwidths,
        }
        for cap in ("hbm", "ddr", "ssd"):
            mine, detected = getattr(trainer, f"{cap}_cap_bytes"), getattr(hardware, f"{cap}_cap_bytes")
            kwargs[f"{cap}_cap"] = mine if mine is not None else detected
            dry = getattr(trainer, f"dry_run_{cap}_bytes", None)
            if trainer.is_dry_run and dry is not None:
                kwargs[f"{cap}_cap"] = dry
            elif not trainer.is_dry_run and cap != "ssd":
                _warn_if_cap_override(f"{cap}_cap", mine, detected)
        if kernel.use_hardware_based_bandwidth:
            names = ["hbm_mem_bw", "ddr_mem_bw", "ssd_mem_bw", "hbm_to_ddr_mem_bw"]
            names += [] if kernel.generalized_comms_bandwidths else ["intra_host_bw", "inter_host_bw"]
            kwargs |= {n: getattr(hardware, n) for n in names if getattr(hardware, n) is not None}
        return Topology(**kwargs, created_by_factory=True)


def _warn_if_cap_override(name: str, trainer_value: int | None, hardware_value: int | None) -> None:
    if trainer_value is None or hardware_value is None or hardware_value <= 0:
        return
    ratio = abs(trainer_value - hardware_value) / hardware_value
    if ratio > _CAP_OVERRIDE_THRESHOLD:
        static_logger.warning(
            f"TopologyFactory: TrainerConfig {name} ({trainer_value / 1024**3:.1f} GiB) differs from "
            f"HardwareConfig {name} ({hardware_value / 1024**3:.1f} GiB) by {ratio:.0%}. "
            "Using TrainerConfig value."
        )
