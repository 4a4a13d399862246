"""From a sharded training state dict to an unsharded model (``torchrec.inference.state_dict_transform``).

After ``DistributedModelParallel`` training, ``model.state_dict()`` holds each sharded table as a
``ShardedTensor`` of this rank's shards. ``state_dict_to_device`` moves such a state dict (every rank
calls it) to another device, e.g. CPU over a gloo group; ``state_dict_gather`` then assembles each entry an
unsharded model's state dict names into that model's tensors: whole tables on rank 0 (ranks must all call
it, as the gather is collective), plain tensors copied on every rank.
"""

import torch
from torch import distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

StateDict = dict[str, torch.Tensor | ShardedTensor]


def state_dict_gather(src: StateDict, dst: dict[str, torch.Tensor]) -> None:
    """Fill ``dst``'s tensors from ``src`` for every key of ``dst`` (sharded ones on rank 0 only)."""
    for key, target in dst.items():
        source = src[key]
        if isinstance(source, ShardedTensor):
            source.gather(out=target if dist.get_rank() == 0 else None, dtype=target.dtype)
        elif isinstance(source, torch.Tensor):
            target.copy_(source)
        else:
            raise ValueError(f"state_dict_gather: {key} is a {type(source).__name__}, not a tensor")


def state_dict_all_gather_keys(state_dict: StateDict, pg: ProcessGroup) -> list[str]:
    """The sorted union of every rank's state-dict keys."""
    per_rank: list[list[str] | None] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(per_rank, list(state_dict.keys()), pg)
    return sorted({key for keys in per_rank for key in keys or []})


def _sharded_to(tensor: ShardedTensor, pg: ProcessGroup, device: torch.device) -> ShardedTensor:
    shards = [
        Shard.from_tensor_and_offsets(
            tensor=shard.tensor.to(device), shard_offsets=shard.metadata.shard_offsets, rank=dist.get_rank(pg)
        )
        for shard in tensor.local_shards()
    ]
    return ShardedTensor._init_from_local_shards(shards, tensor.metadata().size, process_group=pg)


def state_dict_to_device(state_dict: StateDict, pg: ProcessGroup, device: torch.device) -> StateDict:
    """``state_dict`` on ``device``, its sharded tensors re-created over ``pg`` (collective: every rank
    calls it). A key another rank holds and this one does not becomes an empty ``ShardedTensor`` here, so all
    ranks take part in its gather."""
    moved: StateDict = {}
    for key in state_dict_all_gather_keys(state_dict, pg):
        tensor = state_dict.get(key)
        if tensor is None:
            moved[key] = ShardedTensor._init_from_local_shards([], [], process_group=pg)
        elif isinstance(tensor, ShardedTensor):
            moved[key] = _sharded_to(tensor, pg, device)
        elif isinstance(tensor, torch.Tensor):
            moved[key] = tensor.to(device)
        else:
            raise ValueError(f"state_dict_to_device: {key} is a {type(tensor).__name__}, not a tensor")
    return moved
