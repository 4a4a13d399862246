"""Where an id probes in a bucketed multi-probe ZCH table (``torchrec``'s ``TrainInputMapper``).

A ``HashZchManagedCollisionModule``'s rows are split into ``total_num_buckets`` buckets, the unit a table is
sharded and resharded by. An id belongs to one bucket, chosen as the training input distribution chooses
its rank (``id % buckets`` when ``input_hash_size`` is 0, else blocks of ``ceil(input_hash_size / buckets)``),
and probes only within that bucket's rows. The mapper gives each id its bucket's size and first row.
"""

import logging

import fbgemm_gpu  # noqa: F401 - registers torch.ops.fbgemm
import torch
from torch import Tensor

logger = logging.getLogger(__name__)


@torch.fx.wrap
def _tensor_may_to_device(src: Tensor, device: torch.device | None = None) -> tuple[Tensor, torch.device]:
    """``src`` on ``device`` (unchanged for None or meta), and the device it came from."""
    src_device: torch.device = src.device
    if device is None or device.type == "meta" or src_device == device:
        return src, src_device
    return src.to(device), src_device


def _compute_lengths_from_hits(lengths: Tensor, hit_indices: Tensor) -> Tensor:
    """Per row of ``lengths``, how many of its ids are hits (``hit_indices``: one bool per id)."""
    offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
    return torch.ops.fbgemm.segment_sum_csr(1, offsets, hit_indices.to(lengths.dtype))


class TrainInputMapper(torch.nn.Module):
    """``forward(values, output_offset)`` -> (values, each id's bucket size, each id's bucket start row).

    Args:
        input_hash_size: range of the ids (0: unknown, ids go to buckets by ``id % total_num_buckets``).
        total_num_buckets: buckets of the table.
        size_per_rank: rows of each bucket.
        train_rank_offsets: first row of each bucket.
        inference_dispatch_div_train_world_size: also reduce each id to its position within its bucket's
            id range (as an inference input distribution that divides ids does).
        name: the table's name (for logs).
    """

    _zch_size_per_training_rank: Tensor
    _train_rank_offsets: Tensor

    def __init__(
        self,
        input_hash_size: int,
        total_num_buckets: int,
        size_per_rank: Tensor,
        train_rank_offsets: Tensor,
        inference_dispatch_div_train_world_size: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        if total_num_buckets <= 0:
            raise ValueError(f"total_num_buckets must be positive, got {total_num_buckets}")
        self._input_hash_size = input_hash_size
        self._buckets = total_num_buckets
        self._inference_dispatch_div_train_world_size = inference_dispatch_div_train_world_size
        self._name = name
        self.register_buffer("_zch_size_per_training_rank", size_per_rank, persistent=False)
        self.register_buffer("_train_rank_offsets", train_rank_offsets, persistent=False)

    def _get_values_sizes_offsets(
        self, x: Tensor, output_offset: Tensor | None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        sizes, _ = _tensor_may_to_device(self._zch_size_per_training_rank, x.device)
        starts, _ = _tensor_may_to_device(self._train_rank_offsets, x.device)
        # The same bucket choice as the row-wise input distribution of training.
        if self._input_hash_size == 0:
            bucket = x % self._buckets
            if self._inference_dispatch_div_train_world_size:
                x = x // self._buckets
        else:
            block = (self._input_hash_size + self._buckets - 1) // self._buckets
            bucket = x // block
            if self._inference_dispatch_div_train_world_size:
                x = x % block
        local_sizes = sizes.index_select(dim=0, index=bucket)
        offsets = starts.index_select(dim=0, index=bucket)
        if output_offset is not None:
            offsets -= output_offset
        return x, local_sizes, offsets

    def forward(
        self, values: Tensor, output_offset: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        return self._get_values_sizes_offsets(values, output_offset)
