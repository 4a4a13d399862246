"""The collectives the sharding code needs, autograd-aware and with optional async handles.

Every function works on gloo (CPU) and NCCL (CUDA) with the same code, differentiates through its
communication (see ``comm_autograd`` for the adjoint pairs) and, with ``async_op=True``, returns a
``Pending`` whose ``wait()`` gives the result; otherwise the result itself. Split sizes are counted in rows
(dim 0) unless the name says otherwise, and they may be zero. A collective that times out or loses a peer
raises ``CollectiveTimeoutError`` naming itself and the ranks that never reached it (see ``timeouts``).

  exchange_splits          tell every rank how much it will receive (run before a variable all-to-all)
  all_to_all_single        variable all-to-all along dim 0
  all_to_all_with_splits   several tensors (ids, lengths, weights) with one splits exchange: input dist
  alltoall_pooled          pooled embeddings [B_total, D_local] -> [B_rank, sum(D)]: table/column-wise output
  reduce_scatter_v_pooled  sum of partial pools, rows scattered with variable batch: row-wise output dist
  all_gather_v             variable-size all-gather along dim 0
  all_reduce_coalesced     bucketed in-place all-reduce of gradients: data-parallel tables
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
    ReduceScatterEven,
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


def all_to_all_with_splits(
    tensors: Sequence[Tensor],
    input_splits: Sequence[Sequence[int]],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> list[Tensor] | Pending[list[Tensor]]:
    """Variable all-to-all of several tensors (e.g. a KJT's lengths, values, weights) along dim 0.

    ``input_splits[i]`` splits ``tensors[i]`` by destination rank. The receive sizes are exchanged first
    (one small blocking all-to-all for all tensors); the data all-to-alls then run asynchronously.
    """
    if len(tensors) != len(input_splits):
        raise ValueError(f"got {len(tensors)} tensors but {len(input_splits)} lists of input_splits")
    world_size = dist.get_world_size(group)
    for i, (tensor, in_splits) in enumerate(zip(tensors, input_splits)):
        _check_splits(f"input_splits[{i}]", in_splits, world_size, tensor.shape[0], f"tensors[{i}]'s dim 0")
    output_splits = exchange_splits(input_splits, group)
    boxes, outs = [], []
    for tensor, in_splits, out_splits in zip(tensors, input_splits, output_splits):
        box = WorkBox()
        outs.append(AllToAllSingle.apply(box, tensor, out_splits, list(in_splits), group))
        boxes.append(box)
    return _result(Pending([b.work for b in boxes], lambda: outs, "all_to_all_with_splits", group), async_op)


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


def reduce_scatter_v_pooled(
    tensor: Tensor,
    input_splits: Sequence[int],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Tensor | Pending[Tensor]:
    """Sum partial pools over ranks and give rank r rows ``input_splits[r]`` (row-wise output dist).

    ``tensor`` is ``[sum(input_splits), ...]`` on every rank. Equal splits use the backend's reduce-scatter;
    unequal ones an all-to-all plus a local sum in rank order (NCCL's reduce-scatter needs equal blocks, and
    the local sum keeps the result bitwise reproducible). Backward is the matching all-gather.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    _check_splits("input_splits", input_splits, world_size, tensor.shape[0], "tensor's dim 0")
    box = WorkBox()
    if len(set(input_splits)) == 1:
        out = ReduceScatterEven.apply(box, tensor, group)
        return _result(Pending(box.work, lambda: out, "reduce_scatter_v_pooled", group), async_op)
    mine = input_splits[rank]
    received = AllToAllSingle.apply(box, tensor, [mine] * world_size, list(input_splits), group)

    def finish() -> Tensor:
        return received.view(world_size, mine, *tensor.shape[1:]).sum(dim=0)

    return _result(Pending(box.work, finish, "reduce_scatter_v_pooled", group), async_op)


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


def all_reduce_coalesced(
    tensors: Sequence[Tensor],
    group: ProcessGroup | None = None,
    average: bool = False,
    bucket_cap_mb: float = 25.0,
    async_op: bool = False,
) -> list[Tensor] | Pending[list[Tensor]]:
    """Sum (or average) ``tensors`` over ranks in place, flattened into buckets of at most ``bucket_cap_mb``.

    Meant for data-parallel gradients: few large collectives instead of one per parameter. Tensors are grouped
    by (device, dtype); a tensor larger than the cap gets a bucket of its own. Not differentiable.
    """
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
    world_size = dist.get_world_size(group)
    buckets = _buckets(tensors, int(bucket_cap_mb * 2**20))
    flats = [torch.cat([t.detach().reshape(-1) for t in bucket]) for bucket in buckets]
    works = [dist.all_reduce(flat, group=group, async_op=True) for flat in flats]

    def finish() -> list[Tensor]:
        for bucket, flat in zip(buckets, flats):
            if average:
                flat.div_(world_size)
            for t, part in zip(bucket, flat.split([t.numel() for t in bucket])):
                t.detach().copy_(part.view_as(t))
        return list(tensors)

    return _result(Pending(works, finish, "all_reduce_coalesced", group), async_op)


def _buckets(tensors: Sequence[Tensor], cap_bytes: int) -> list[list[Tensor]]:
    """Group tensors by (device, dtype), in order, into buckets of at most ``cap_bytes`` each."""
    open_buckets: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], int]] = {}
    closed: list[list[Tensor]] = []
    for t in tensors:
        key = (t.device, t.dtype)
        bucket, size = open_buckets.get(key, ([], 0))
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > cap_bytes:
            closed.append(bucket)
            bucket, size = [], 0
        bucket.append(t)
        open_buckets[key] = (bucket, size + nbytes)
    return closed + [bucket for bucket, _ in open_buckets.values() if bucket]
