"""DistributedModelParallel's data-parallel step as TorchRec's: ``init_data_parallel=False`` defers it, a
``DefaultDataParallelWrapper`` passes its options to DDP, and what rectrain cannot honour is refused."""

from __future__ import annotations

import pytest
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rectrain.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig
from rectrain.errors import ConfigError
from tests.distributed.multiprocess import run_multiprocess


@pytest.fixture(autouse=True)
def _fbgemm_backward(monkeypatch):
    # Skip compiling the native CPU backward in every spawned rank: these tests never train.
    monkeypatch.setenv("RECTRAIN_CPU_BACKWARD", "fbgemm")


def _model() -> nn.Module:
    tables = [EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=4, feature_names=["f"])]
    return nn.ModuleDict({"ebc": EmbeddingBagCollection(tables=tables), "dense": nn.Linear(4, 1)})


def _wrapping(env) -> tuple:
    deferred = DistributedModelParallel(_model(), env=env, device="cpu", init_data_parallel=False)
    before = isinstance(deferred._dmp_wrapped_module, DistributedDataParallel)
    deferred.init_data_parallel()
    after = deferred._dmp_wrapped_module
    wrapper = DefaultDataParallelWrapper(bucket_cap_mb=1, static_graph=False, params_to_ignore=["dense.bias"])
    custom = DistributedModelParallel(_model(), env=env, device="cpu", data_parallel_wrapper=wrapper)
    ddp = custom._dmp_wrapped_module
    return (
        before,
        isinstance(after, DistributedDataParallel),
        ddp.bucket_bytes_cap,
        "dense.bias" in (ddp.parameters_to_ignore),
    )


def test_data_parallel_is_deferred_or_wrapped_with_the_wrappers_options():
    for result in run_multiprocess(_wrapping, 2, timeout=300.0):
        assert result == (False, True, 1024 * 1024, True)


def test_what_rectrain_cannot_honour_is_refused_by_name():
    with pytest.raises(ConfigError, match="allreduce_comm_precision='bf16'"):
        DefaultDataParallelWrapper(allreduce_comm_precision="bf16")
    with pytest.raises(ConfigError, match="init_parameters=False"):
        DistributedModelParallel(_model(), env=None, device="cpu", init_parameters=False)
