"""No host sync in a steady-state training step: nothing in it reads a device tensor back (issue 39).

On CPU, ``tests.host_syncs`` counts the calls that would wait for a GPU (``.item()``, ``.tolist()``,
``bool``/``int`` of a tensor, data-dependent sizes, tensors built from Python data) made by our own code
during steady-state steps; FBGEMM's and torch.optim's reads of their host-side counters are theirs and not
counted. The id check then runs as it does on a GPU (deferred): the one read it makes is of the verdict's host
copy, which on a GPU lands without waiting. On CUDA the same steps run under
``torch.cuda.set_sync_debug_mode("error")``, which raises at the first synchronizing call.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.distributed import DistributedModelParallel
from rectrain.models import DLRM, Batch, DLRMTrain
from rectrain.sparse import KeyedJaggedTensor
from rectrain.train import TrainPipelineBase, TrainPipelineSparseDist
from tests.distributed.multiprocess import run_multiprocess
from tests.host_syncs import count_host_syncs

T, E, D, DENSE = 4, 1000, 8, 5
# Reads of host data by design: the id check's verdict (its pinned host copy on a GPU) and a batch's
# per-key id counts, taken on the host before its copy (Batch.to).
HOST_READS = {"report", "_count_on_host"}


def _tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=D, num_embeddings=E, feature_names=[f"f{i}"])
        for i in range(T)
    ]


def _model(device: torch.device | None = None) -> DLRMTrain:
    optimizer = FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=0.05, cpu_backward="fbgemm")
    ebc = EmbeddingBagCollection(_tables(), fused_optimizer=optimizer, device=device)
    return DLRMTrain(DLRM(ebc, DENSE, [16, D], [16, 1]))


def _batches(rank: int, batch: int = 32) -> list[Batch]:
    out = []
    for step in range(4):
        g = torch.Generator().manual_seed(1000 * rank + step)
        lengths = torch.randint(0, 4, (T * batch,), generator=g)
        values = torch.randint(0, E, (int(lengths.sum()),), generator=g)
        kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(T)], values=values, lengths=lengths)
        dense = torch.randn(batch, DENSE, generator=g)
        out.append(Batch(dense, kjt, torch.randint(0, 2, (batch,), generator=g).float()))
    return out


def _deferred_id_checks(model: torch.nn.Module) -> None:
    """Check ids as on a GPU (on the device, verdict read later)."""
    for module in model.modules():
        check = getattr(module, "_id_check", None)
        if check is not None:
            check.deferred = True


def _steady_state_syncs(model, optimizer, device, pipelined: bool, rank: int) -> list[str]:
    pipeline_type = TrainPipelineSparseDist if pipelined else TrainPipelineBase
    pipeline = pipeline_type(model, optimizer, device)
    data = _batches(rank)
    batches = (data[i % 4] for i in itertools.count())
    for _ in range(3):  # warm-up: first-use work (device constants, caches) happens here
        pipeline.progress(batches)
    with count_host_syncs() as syncs:
        for _ in range(3):
            pipeline.progress(batches)
    return syncs.ours().outside(HOST_READS)


def _sharded(env, pipelined: bool, meta: bool = False) -> list[str]:
    torch.manual_seed(0)
    built = _model(torch.device("meta") if meta else None)  # rectrain train builds sharded tables on meta
    model = DistributedModelParallel(built, env=env, batch_size=32)
    _deferred_id_checks(model)
    dense = [p for n, p in model.named_parameters() if "sparse_arch" not in n]
    return _steady_state_syncs(model, torch.optim.Adagrad(dense), torch.device("cpu"), pipelined, env.rank)


@pytest.mark.parametrize("pipelined,meta", [(False, False), (True, False), (True, True)])
def test_a_sharded_step_on_one_rank_reads_nothing_back(pipelined, meta):
    (syncs,) = run_multiprocess(_sharded, 1, pipelined, meta)
    assert syncs == []


def test_an_unsharded_step_reads_nothing_back():
    torch.manual_seed(0)
    model = _model()
    dense = [p for n, p in model.named_parameters() if "sparse_arch" not in n]
    syncs = _steady_state_syncs(model, torch.optim.Adagrad(dense), torch.device("cpu"), False, 0)
    assert syncs == []


def test_the_counter_sees_the_reads_it_is_for():
    t = torch.arange(4)
    with count_host_syncs() as syncs:
        t.tolist(), t.sum().item(), bool(t.any()), int(t[0]), t.nonzero(), torch.tensor([1, 2])
    kinds = [kind for kind, _ in syncs.events]
    assert kinds.count("item/bool/int") == 3
    assert {"tolist", "nonzero", "tensor from Python data"} <= set(kinds)


def test_a_bad_id_is_reported_by_the_next_deferred_check():
    from rectrain.distributed.routing.id_check import IdCheck

    check = IdCheck(["a", "b"], [10, 5], deferred=True)
    lengths = torch.tensor([[1, 1], [1, 1]])
    check(lengths, torch.tensor([1, 2, 3, 4]))
    check(lengths, torch.tensor([1, 2, 3, 7]))  # 7 >= 5 rows of b's table
    with pytest.raises(ValueError, match=r"feature 'b': id 7 is out of range .*num_embeddings=5.*1 before"):
        check(lengths, torch.tensor([1, 2, 3, 4]))
    immediate = IdCheck(["a", "b"], [10, 5], deferred=False)
    with pytest.raises(ValueError, match=r"feature 'a': id -1"):
        immediate(lengths, torch.tensor([-1, 2, 3, 4]))


@pytest.mark.gpu
@pytest.mark.parametrize("sharded", [False, True])
def test_steady_state_steps_on_cuda_do_not_synchronize(sharded, tmp_path):
    """The same steps on a GPU under ``set_sync_debug_mode("error")`` (one rank; NCCL when sharded)."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    if sharded:
        import torch.distributed as dist

        from rectrain.distributed import ShardingEnv

        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1)
        try:
            model = DistributedModelParallel(
                _model(), env=ShardingEnv.from_process_group(dist.group.WORLD), device=device, batch_size=32
            )
            _run_without_syncs(model, device)
        finally:
            dist.destroy_process_group()
    else:
        _run_without_syncs(_model(device).to(device), device)


def _run_without_syncs(model: torch.nn.Module, device: torch.device) -> None:
    dense = [p for n, p in model.named_parameters() if "sparse_arch" not in n]
    pipeline = TrainPipelineSparseDist(model, torch.optim.Adagrad(dense), device)
    data = _batches(0)
    batches = (data[i % 4] for i in itertools.count())
    for _ in range(3):
        pipeline.progress(batches)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(5):
            pipeline.progress(batches)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
