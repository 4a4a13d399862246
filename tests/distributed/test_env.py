"""ShardingEnv geometry, init_from_env (errors in-process, the real thing under torchrun), host subgroups."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from rectrain import compat
from rectrain.distributed import ShardingEnv, init_from_env, intra_and_cross_node_pg
from rectrain.errors import ConfigError
from tests.distributed.multiprocess import run_multiprocess

HERE = pathlib.Path(__file__).parent


def test_geometry_is_host_major():
    env = ShardingEnv.from_local(world_size=8, rank=5, local_world_size=4)
    assert (env.node, env.local_rank, env.num_nodes, env.pg) == (1, 1, 2, None)
    assert ShardingEnv.from_local(3, 2).local_world_size == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 4, "rank": 4}, r"rank must be in \[0, 4\), got 4"),
        ({"world_size": 0, "rank": 0}, "world_size must be >= 1, got 0"),
        ({"world_size": 6, "rank": 0, "local_world_size": 4}, r"local_world_size \(4\) .* world_size \(6\)"),
    ],
)
def test_bad_geometry_is_rejected(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ShardingEnv.from_local(**kwargs)


def test_init_from_env_names_missing_variables(monkeypatch):
    assert not dist.is_initialized()
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="WORLD_SIZE, MASTER_ADDR, MASTER_PORT; launch with `torchrun"):
        init_from_env("gloo")
    monkeypatch.setenv("WORLD_SIZE", "two")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(ConfigError, match="WORLD_SIZE must be an integer, got 'two'"):
        init_from_env("gloo")


def _check_host_groups(env: ShardingEnv) -> tuple[list[int], list[int]]:
    """Emulated 2 hosts x 2 ranks: each group all-gathers its members' global ranks."""
    assert (env.local_world_size, env.local_rank) == (2, int(os.environ["LOCAL_RANK"]))
    intra, cross = intra_and_cross_node_pg(env)
    members = []
    for group in (intra, cross):
        out = torch.empty(dist.get_world_size(group), dtype=torch.int64)
        compat.all_gather_single(out, torch.tensor([env.rank]), group)
        members.append(out.tolist())
    return members[0], members[1]


@pytest.mark.slow  # four ranks on two cores: ~5-8 s
def test_intra_and_cross_node_groups():
    results = run_multiprocess(_check_host_groups, 4, local_world_size=2)
    assert results == [([0, 1], [0, 2]), ([0, 1], [1, 3]), ([2, 3], [0, 2]), ([2, 3], [1, 3])]


@pytest.mark.slow
def test_init_from_env_under_torchrun(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    cmd += ["--rdzv-endpoint", "localhost:0", str(HERE / "torchrun_script.py"), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    expected = {"world_size": 2, "local_world_size": 2, "backend": "gloo", "sum": 3}
    for rank, report in enumerate(reports):
        assert report == {**expected, "rank": rank, "local_rank": rank}
