"""The collectives the sharding code needs, autograd-aware and with optional async handles.

Every function works on gloo (CPU) and NCCL (CUDA) with the same code, differentiates through its
communication (see ``comm_autograd`` for the adjoint pairs) and, with ``async_op=True``, returns a
``Pending`` whose ``wait()`` gives the result; otherwise the result itself. Split sizes are counted in rows
(dim 0) unless the name says otherwise, and they may be zero. A collective that times out or loses a peer
raises ``CollectiveTimeoutError`` naming itself and the ranks that never reached it (see ``timeouts``).

  exchange_splits          tell every rank how much it will receive (run before a variable all-to-all)
  all_to_all_single        variable all-to-all along dim 0
  alltoall_pooled          pooled embeddings [B_total, D_local] -> [B_rank, sum(D)]: table/column-wise output
  all_gather_v             variable-size all-gather along dim 0
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain import compat
from rectrain.distributed.comm.autograd import (
    AllGatherEven,
    AllToAllSingle,
    WorkBox,
    comm_device,
)
from rectrain.distributed.comm.pending import Pending
from rectrain.distributed.comm.timeouts import collective

ProcessGroup = dist.ProcessGroup


def _check_splits(name: str, splits: Sequence[int], world_size: int, total: int | None, what: str) -> None:
    if len(splits) != world_size:
        raise ValueError(f"{name} has {len(splits)} entries but the process group has {world_size} ranks")
    if any(s < 0 for s in splits):
        raise ValueError(f"{name} must be non-negative, got {list(splits)}")
    if total is not None and sum(splits) != total:
        raise ValueError(f"{name} {list(splits)} sum to {sum(splits)} but {what} is {total}")


def _result(pending: Pending, async_op: bool):
    return pending if async_op else pending.wait()


def exchange_splits(
    input_splits: Sequence[Sequence[int]], group: ProcessGroup | None = None
) -> list[list[int]]:
    """Exchange split sizes so each rank learns what it will receive; blocks (sizes are needed to allocate).

    ``input_splits[i][r]`` is how many rows of tensor ``i`` this rank sends to rank ``r``; the result's
    ``[i][r]`` is how many rows of tensor ``i`` this rank receives from rank ``r``. One all-to-all serves any
    number of tensors.
    """
    world_size = dist.get_world_size(group)
    for i, splits in enumerate(input_splits):
        _check_splits(f"input_splits[{i}]", splits, world_size, None, "")
    num = len(input_splits)
    send = torch.tensor(input_splits, dtype=torch.int64).reshape(num, world_size).t().contiguous()
    send = send.to(comm_device(group))
    recv = torch.empty_like(send)
    with collective("exchange_splits", group):
        dist.all_to_all_single(recv, send, group=group)
    return recv.t().tolist()


def all_to_all_single(
    tensor: Tensor,
    output_split_sizes: Sequence[int] | None,
    input_split_sizes: Sequence[int] | None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Tensor | Pending[Tensor]:
    """All-to-all along dim 0: rows ``input_split_sizes[r]`` go to rank r; rank s's rows arrive in order.

    ``None`` splits mean equal blocks (then every rank's dim 0 must be the same multiple of the world size).
    Differentiable: the gradient flows back through the reverse all-to-all.
    """
    world_size = dist.get_world_size(group)
    rows = tensor.shape[0] if tensor.dim() > 0 else 0
    if input_split_sizes is None:
        if rows % world_size:
            raise ValueError(f"even all-to-all needs dim 0 ({rows}) divisible by world size ({world_size})")
        input_split_sizes = [rows // world_size] * world_size
    if output_split_sizes is None:
        output_split_sizes = [rows // world_size] * world_size
    _check_splits("input_split_sizes", input_split_sizes, world_size, rows, "tensor's dim 0")
    _check_splits("output_split_sizes", output_split_sizes, world_size, None, "")
    box = WorkBox()
    out = AllToAllSingle.apply(box, tensor, list(output_split_sizes), list(input_split_sizes), group)
    return _result(Pending(box.work, lambda: out, "all_to_all_single", group), async_op)


def alltoall_pooled(
    tensor: Tensor,
    batch_size_per_rank: Sequence[int],
    dim_sum_per_rank: Sequence[int],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Tensor | Pending[Tensor]:
    """Send pooled embeddings back to the ranks that own the samples (table-/column-wise output dist).

    ``tensor`` is this rank's ``[sum(batch_size_per_rank), dim_sum_per_rank[rank]]`` pooled output for the
    whole global batch; rows ``batch_size_per_rank[r]`` belong to rank r. The result is
    ``[batch_size_per_rank[rank], sum(dim_sum_per_rank)]``: every rank's columns side by side in rank order.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    _check_splits("batch_size_per_rank", batch_size_per_rank, world_size, None, "")
    _check_splits("dim_sum_per_rank", dim_sum_per_rank, world_size, None, "")
    expected = (sum(batch_size_per_rank), dim_sum_per_rank[rank])
    if tensor.dim() != 2 or tuple(tensor.shape) != expected:
        raise ValueError(
            f"alltoall_pooled expects a [sum(batch_size_per_rank), dim_sum_per_rank[{rank}]] = "
            f"{list(expected)} tensor on rank {rank}, got {list(tensor.shape)}"
        )
    my_batch = batch_size_per_rank[rank]
    # Row blocks of a row-major [B, D] tensor are contiguous, so the flat view splits by destination directly.
    input_splits = [b * dim_sum_per_rank[rank] for b in batch_size_per_rank]
    output_splits = [my_batch * d for d in dim_sum_per_rank]
    box = WorkBox()
    flat = AllToAllSingle.apply(box, tensor.reshape(-1), output_splits, input_splits, group)

    def finish() -> Tensor:
        blocks = flat.split(output_splits)
        return torch.cat([blk.view(my_batch, d) for blk, d in zip(blocks, dim_sum_per_rank)], dim=1)

    return _result(Pending(box.work, finish, "alltoall_pooled", group), async_op)


def all_gather_v(
    tensor: Tensor,
    sizes: Sequence[int] | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Tensor | Pending[Tensor]:
    """Concatenate every rank's ``tensor`` along dim 0 in rank order; dim 0 may differ per rank.

    ``sizes[r]`` is rank r's dim 0; pass it when known, otherwise it is exchanged first (blocking). Unequal
    sizes are padded to the largest for the gather and trimmed afterwards (gloo's all-gather needs equal
    sizes). Backward is the matching reduce-scatter.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if sizes is None:
        sizes = _gather_sizes(tensor.shape[0], group)
    _check_splits("sizes", sizes, world_size, None, "")
    if sizes[rank] != tensor.shape[0]:
        raise ValueError(f"sizes[{rank}] is {sizes[rank]} but this rank's tensor has {tensor.shape[0]} rows")
    box = WorkBox()
    longest = max(sizes)
    padded = tensor
    if tensor.shape[0] < longest:
        padding = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
        padded = torch.cat([tensor, padding])
    gathered = AllGatherEven.apply(box, padded, group)
    if len(set(sizes)) == 1:
        return _result(Pending(box.work, lambda: gathered, "all_gather_v", group), async_op)

    def finish() -> Tensor:
        return torch.cat([gathered[r * longest : r * longest + n] for r, n in enumerate(sizes)])

    return _result(Pending(box.work, finish, "all_gather_v", group), async_op)


def _gather_sizes(rows: int, group: ProcessGroup | None) -> list[int]:
    device = comm_device(group)
    sizes = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=device)
    with collective("all_gather_v (sizes)", group):
        compat.all_gather_single(sizes, torch.tensor([rows], dtype=torch.int64, device=device), group)
    return sizes.tolist()
