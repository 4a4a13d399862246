"""rectrain.compat: each branch of each torch-version difference, on CPU (the 2.11 branches are forced).

The 2.11 branches call what torch 2.11 has (``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``broadcast_buffers=False``), which torch 2.13 still provides, so both branches run here on real ranks.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from rectrain import compat
from tests.distributed.multiprocess import run_multiprocess

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_pick_prefers_the_new_name_and_falls_back_to_the_old():
    def new():
        return "new"

    def old():
        return "old"

    assert compat.pick(SimpleNamespace(gather=new, gather_old=old), "gather", "gather_old")() == "new"
    assert compat.pick(SimpleNamespace(gather_old=old), "gather", "gather_old")() == "old"
    # This torch (2.13) has the new names; 2.11 only the old ones.
    assert compat.pick(dist, "all_gather_single", "all_gather_into_tensor") is dist.all_gather_single


def test_forward_sync_buffers_is_detected_from_the_signature():
    class Ddp213:
        def __init__(self, module, broadcast_buffers=None, forward_sync_buffers=None): ...

    class Ddp211:
        def __init__(self, module, broadcast_buffers=True): ...

    assert compat.has_forward_sync_buffers(Ddp213)
    assert not compat.has_forward_sync_buffers(Ddp211)
    assert compat.buffers_once_kwargs(True) == {"forward_sync_buffers": False}
    assert compat.buffers_once_kwargs(False) == {"broadcast_buffers": False}


def test_minor_versions():
    assert compat.minor("2.11.0+cu130") == "2.11"
    assert compat.minor("1.8.0") == "1.8"
    torch_minor, fbgemm_minor = compat.running_pair()
    assert torch_minor == compat.minor(torch.__version__)
    assert compat.is_supported(torch_minor, fbgemm_minor)
    assert not compat.is_supported("2.12", "1.8")


def test_pyproject_states_the_supported_pairs():
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    stated = [
        (p["torch"], p["fbgemm-gpu"], p["torchrec"]) for p in pyproject["tool"]["rectrain"]["supported-pairs"]
    ]
    assert tuple(stated) == compat.SUPPORTED_PAIRS
    # The default install is the newest pair.
    deps = pyproject["project"]["dependencies"]
    torch_minor, fbgemm_minor, _ = compat.SUPPORTED_PAIRS[0]
    assert f"torch=={torch_minor}.0" in deps and f"fbgemm-gpu-cpu=={fbgemm_minor}.0" in deps


class _WithBuffer(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.register_buffer("counter", torch.full((3,), float(rank)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).sum()


def _collectives_both_branches(env):
    torch.manual_seed(0)
    old = SimpleNamespace(
        all_gather_into_tensor=dist.all_gather_into_tensor, reduce_scatter_tensor=dist.reduce_scatter_tensor
    )
    mine = torch.arange(3, dtype=torch.float32) + 10 * env.rank
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # 2.13 deprecates the 2.11 names
        for branch, namespace in (("new", dist), ("old", old)):
            gather = compat.pick(namespace, "all_gather_single", "all_gather_into_tensor")
            scatter = compat.pick(namespace, "reduce_scatter_single", "reduce_scatter_tensor")
            gathered = torch.empty(3 * env.world_size)
            gather(gathered, mine, env.pg, False)
            scattered = torch.empty(1)
            scatter(scattered, torch.arange(2, dtype=torch.float32) + env.rank, dist.ReduceOp.SUM, env.pg)
            results[f"gather_{branch}"], results[f"scatter_{branch}"] = gathered, scattered
    # The module's own functions (whichever branch this torch takes) agree with both.
    gathered = torch.empty(3 * env.world_size)
    compat.all_gather_single(gathered, mine, env.pg)
    results["gather_compat"] = gathered
    return results


def test_collectives_agree_on_both_branches():
    ranks = run_multiprocess(_collectives_both_branches, 2)
    for result in ranks:
        expected = torch.tensor([0.0, 1, 2, 10, 11, 12])
        for branch in ("new", "old", "compat"):
            assert torch.equal(result[f"gather_{branch}"], expected)
        assert torch.equal(result["scatter_new"], result["scatter_old"])
    # Rank r gets element r of the sum of [0, 1] and [1, 2].
    assert [float(r["scatter_old"]) for r in ranks] == [1.0, 3.0]


def _buffers_once(env, separate: bool):
    torch.manual_seed(env.rank)  # different weights per rank: DDP must make them equal
    module = _WithBuffer(env.rank)
    wrapped = compat.data_parallel(
        module, device_ids=None, process_group=env.pg, ignored=set(), separate_buffer_sync=separate
    )
    after_construction = module.counter.clone()
    module.counter.fill_(100.0 + env.rank)  # a rank's own change must survive the next forward
    wrapped(torch.ones(4, 2)).backward()
    return {
        "after_construction": after_construction,
        "after_forward": module.counter.clone(),
        "weight": module.linear.weight.detach().clone(),
    }


def test_ddp_syncs_buffers_once_on_both_branches():
    for separate in (True, False):
        ranks = run_multiprocess(_buffers_once, 2, separate)
        for rank, result in enumerate(ranks):
            assert torch.equal(result["after_construction"], torch.zeros(3)), (separate, rank)
            assert torch.equal(result["after_forward"], torch.full((3,), 100.0 + rank)), (separate, rank)
        assert torch.equal(ranks[0]["weight"], ranks[1]["weight"])
