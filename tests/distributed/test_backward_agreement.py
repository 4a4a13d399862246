"""Every rank of a run trains with the same CPU embedding backward: rank 0's ``auto``, agreed in
``DistributedModelParallel`` on real gloo ranks, whatever each rank's environment would pick on its own."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from rectrain.distributed import DistributedModelParallel
from rectrain.distributed.parallel import backward_agreement
from rectrain.embedding import EmbeddingBagCollection, backward_choice
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.embedding.cpu_backward_runner import compiled_ready
from tests.distributed.multiprocess import run_multiprocess

pytestmark = pytest.mark.skipif(not compiled_ready(), reason="numba kernel unavailable here")


class _Model(nn.Module):
    def __init__(self, cpu_backward: str) -> None:
        super().__init__()
        tables = [
            EmbeddingBagConfig(name=f"t{i}", num_embeddings=20, embedding_dim=8, feature_names=[f"f{i}"])
            for i in range(4)
        ]
        optimizer = FusedOptimizerConfig("rowwise_adagrad", lr=0.1, cpu_backward=cpu_backward)
        self.ebc = EmbeddingBagCollection(tables, fused_optimizer=optimizer)
        self.top = nn.Linear(32, 1)


def _kernels_run(dmp: DistributedModelParallel) -> set[str]:
    """Which backward this rank's table batches run (``native``: our compiled one), from the kernels built."""
    batches = dmp.module.ebc.embedding_bags.batches
    return {"native" if batch._native is not None else "fbgemm" for batch in batches}


def _scenario(env, rank_env: dict[int, str], no_compiled_kernel: list[int], cpu_backward: str) -> dict:
    os.environ.pop(backward_choice.ENV_VAR, None)
    if env.rank in rank_env:
        os.environ[backward_choice.ENV_VAR] = rank_env[env.rank]
    ready = backward_agreement.compiled_ready
    if env.rank in no_compiled_kernel:  # as where numba is missing or its kernel fails the self-check
        backward_choice.compiled_ready = backward_agreement.compiled_ready = lambda: False
    try:
        dmp = DistributedModelParallel(_Model(cpu_backward), env=env, device="cpu", batch_size=4)
    finally:
        backward_choice.compiled_ready = backward_agreement.compiled_ready = ready
    choice = dmp.cpu_backward["ebc"]
    return {"kernel": choice.kernel, "reason": choice.reason, "runs": sorted(_kernels_run(dmp))}


def _scenarios(env) -> list[dict]:
    torch.manual_seed(0)
    return [
        _scenario(env, {}, [], "auto"),
        _scenario(env, {1: "fbgemm"}, [], "auto"),  # rank 1 alone would take FBGEMM's
        _scenario(env, {0: "fbgemm"}, [], "auto"),  # rank 0 forces FBGEMM's: every rank takes it
        _scenario(env, {}, [1], "auto"),  # rank 1 cannot run the compiled kernel
        _scenario(env, {1: "fbgemm"}, [], "native"),  # the config forces a kernel: the variable is ignored
    ]


def test_auto_is_rank_zeros_choice_on_every_rank() -> None:
    rank0, rank1 = run_multiprocess(_scenarios, 2)
    assert rank0 == rank1
    default, env_on_rank1, env_on_rank0, broken_rank1, forced = rank0
    assert default["kernel"] == "native" and default["runs"] == ["native"]
    assert default["reason"].startswith("rank 0's choice: auto: the compiled kernel runs here")
    assert env_on_rank1 == default
    assert env_on_rank0 == {
        "kernel": "fbgemm",
        "reason": "rank 0's choice: RECTRAIN_CPU_BACKWARD=fbgemm",
        "runs": ["fbgemm"],
    }
    assert broken_rank1["kernel"] == "fbgemm" and broken_rank1["runs"] == ["fbgemm"]
    assert "ranks [1] cannot run the compiled kernel" in broken_rank1["reason"]
    assert forced == {"kernel": "native", "reason": "cpu_backward='native' in the config", "runs": ["native"]}
