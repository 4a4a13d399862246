import pytest

from rectrain.errors import ConfigError
from rectrain.planner import Topology
from rectrain.planner.topology import HBM_CAP, host_memory_bytes


def test_geometry_defaults_to_one_host():
    topo = Topology(world_size=4, ddr_cap=1000)
    assert topo.local_world_size == 4
    assert topo.num_hosts == 1
    assert [d.rank for d in topo.devices] == [0, 1, 2, 3]
    assert all(d.storage.ddr == 1000 for d in topo.devices)
    assert topo.comm_bw == 1000 * topo.intra_host_bw  # bytes/s of bytes/ms


def test_multi_host_uses_inter_host_bandwidth():
    topo = Topology(world_size=8, local_world_size=4, ddr_cap=1000)
    assert topo.num_hosts == 2
    assert topo.comm_bw == 1000 * topo.inter_host_bw


def test_cpu_ddr_cap_is_host_memory_split_over_local_ranks():
    topo = Topology(world_size=4, local_world_size=2)
    assert topo.ddr_cap == host_memory_bytes() // 2
    assert topo.hbm_cap == 0
    assert topo.capacity(3) == topo.ddr_cap


def test_cuda_cap_is_hbm():
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=5000, ddr_cap=10)
    assert topo.capacity(1) == 5000
    assert topo.mem_bw == 1000 * topo.hbm_mem_bw


def test_cuda_cap_detected_or_default():
    import torch

    topo = Topology(world_size=1, compute_device="cuda", ddr_cap=10)
    expected = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else HBM_CAP
    assert topo.hbm_cap == expected


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"world_size": 0}, "world_size must be a positive int, got 0"),
        (
            {"world_size": 6, "local_world_size": 4},
            "world_size (6) must be a multiple of local_world_size (4)",
        ),
        ({"world_size": 2, "local_world_size": 0}, "local_world_size must be a positive int, got 0"),
        (
            {"world_size": 2, "compute_device": "tpu"},
            "compute_device must be one of ('cpu', 'cuda', 'mtia'), got 'tpu'",
        ),
        ({"world_size": 2, "ddr_cap": -1}, "ddr_cap must be a non-negative int of bytes, got -1"),
        ({"world_size": 2, "inter_host_bw": 0}, "inter_host_bw must be > 0, got 0"),
    ],
)
def test_validation_messages(kwargs, message):
    with pytest.raises(ConfigError) as info:
        Topology(**kwargs)
    assert message in str(info.value)
