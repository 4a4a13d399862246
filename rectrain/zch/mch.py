"""``MCHManagedCollisionModule``: a sorted id table with periodic eviction (``torchrec``'s MCH module).

State (buffers, checkpointed with the model): ``_mch_sorted_raw_ids`` holds the resident ids in ascending
order (empty slots hold int64 max, so they sort last) and ``_mch_remapped_ids_mapping`` the row each of them
owns; the eviction policy adds per-slot metadata (``_mch_counts``, ``_mch_last_access_iter``). Remapping is
a binary search: a resident id gets its row, any other id the table's last row (the miss row, which the
policies never give away).

In training, ``profile`` appends each batch's ids to a history; every ``eviction_interval`` steps the
distinct ids of the history compete with the residents under the policy, newcomers take the rows of the
evicted, and ``evict()`` then reports those rows (their embeddings belong to other ids now). In eval mode
the table does not change.
"""

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from rectrain.sparse import JaggedTensor
from rectrain.zch.eviction import MCHEvictionPolicy
from rectrain.zch.module import ManagedCollisionModule

logger = logging.getLogger(__name__)

_EMPTY = torch.iinfo(torch.int64).max
HashFunc = Callable[[Tensor, int], Tensor]


@torch.fx.wrap
def _mch_remap(
    features: dict[str, JaggedTensor],
    mch_sorted_raw_ids: Tensor,
    mch_remapped_ids_mapping: Tensor,
    zch_index: int,
) -> dict[str, JaggedTensor]:
    """Each feature with resident ids replaced by their rows and the rest by ``zch_index`` (the miss row)."""
    remapped: dict[str, JaggedTensor] = {}
    for name, feature in features.items():
        ids = feature.values()
        # Search all but the last slot, so every position found is a valid index.
        position = torch.searchsorted(mch_sorted_raw_ids[:-1], ids)
        hit = mch_sorted_raw_ids[position] == ids
        rows = torch.where(hit, mch_remapped_ids_mapping[position], torch.full_like(ids, zch_index))
        remapped[name] = JaggedTensor(
            values=rows,
            lengths=feature.lengths(),
            offsets=feature.offsets(),
            weights=feature.weights_or_none(),
        )
    return remapped


class MCHManagedCollisionModule(ManagedCollisionModule):
    """Remaps ids to the rows of a ``zch_size``-row table, keeping the ids the eviction policy favours.

    Args:
        zch_size: rows of the table (equal to its ``num_embeddings``).
        device: where the state lives.
        eviction_policy: who stays (``rectrain.zch.eviction``).
        eviction_interval: training steps between evictions.
        input_hash_size: range of the input ids (passed to ``input_hash_func``; routes ids to shards).
        input_hash_func: optional ``f(ids, input_hash_size)`` applied to ids first.
        mch_size, mch_hash_func: deprecated in TorchRec and ignored (a warning says so).
        name: the table's name.
        output_global_offset: first row of this module's range (row-wise shards).
        output_segments: row boundaries of the shards (default: this module's range).
        buckets: buckets of the rows.
    """

    def __init__(
        self,
        zch_size: int,
        device: torch.device,
        eviction_policy: MCHEvictionPolicy,
        eviction_interval: int,
        input_hash_size: int = (2**63) - 1,
        input_hash_func: HashFunc | None = None,
        mch_size: int | None = None,
        mch_hash_func: HashFunc | None = None,
        name: str | None = None,
        output_global_offset: int = 0,
        output_segments: list[int] | None = None,
        buckets: int = 1,
    ) -> None:
        if output_segments is None:
            output_segments = [output_global_offset, output_global_offset + zch_size]
        super().__init__(device=device, output_segments=output_segments)
        if mch_size is not None or mch_hash_func is not None:
            logger.warning("mch_size and mch_hash_func are deprecated (as in TorchRec) and ignored")
        if zch_size <= 0:
            raise ValueError(f"zch_size must be > 0, got {zch_size}")
        if eviction_interval <= 0:
            raise ValueError(f"eviction_interval must be > 0, got {eviction_interval}")
        self._name = name
        self._zch_size = zch_size
        self._input_hash_size = input_hash_size
        self._input_hash_func = input_hash_func
        self._output_global_offset = output_global_offset
        self._eviction_interval = eviction_interval
        self._eviction_policy = eviction_policy
        self._buckets = buckets
        self._current_iter = -1  # read from _current_iter_tensor on the first training step
        self._last_eviction_iter = -1
        self._evicted = False
        self._evicted_emb_indices: Tensor = torch.empty((1,), device=device)
        self._register_table_buffers()
        self._mch_metadata: dict[str, Tensor] = {}
        self._history_metadata: dict[str, Tensor] = {}
        self._register_metadata_buffers()
        self._input_history_buffer_size = -1  # sized on the first training batch
        self._current_history_buffer_offset = 0

    def _register_table_buffers(self) -> None:
        size, device = self._zch_size, self.device
        self.register_buffer(
            "_mch_sorted_raw_ids", torch.full((size,), _EMPTY, dtype=torch.int64, device=device)
        )
        self.register_buffer(
            "_mch_slots", torch.tensor([size - 1], dtype=torch.int64, device=device), persistent=False
        )
        self.register_buffer(
            "_delimiter", torch.tensor([_EMPTY], dtype=torch.int64, device=device), persistent=False
        )
        start = self._output_global_offset
        self.register_buffer(
            "_mch_remapped_ids_mapping", torch.arange(start, start + size, dtype=torch.int64, device=device)
        )

    def _register_metadata_buffers(self) -> None:
        for info in self._eviction_policy.metadata_info:
            if info.is_mch_metadata:
                name = "_mch_" + info.metadata_name
                self.register_buffer(
                    name, torch.zeros((self._zch_size,), dtype=torch.int64, device=self.device)
                )
                self._mch_metadata[info.metadata_name] = getattr(self, name)

    def _init_history_buffers(self, features: dict[str, JaggedTensor]) -> None:
        """Size the id history for ``eviction_interval`` batches like this one, with a quarter spare."""
        per_batch = sum(feature.values().numel() for feature in features.values())
        self._input_history_buffer_size = int(per_batch * self._eviction_interval * 1.25)
        size = self._input_history_buffer_size
        self._history_accumulator = torch.empty(size, dtype=torch.int64, device=self.device)
        for info in self._eviction_policy.metadata_info:
            if info.is_history_metadata:
                name = "_history_" + info.metadata_name
                buffer = torch.zeros(size, dtype=torch.int64, device=self.device)
                self.register_buffer(name, buffer, persistent=False)
                self._history_metadata[info.metadata_name] = getattr(self, name)

    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        if self._input_hash_func is None:
            return features
        return {
            name: JaggedTensor(
                values=self._input_hash_func(feature.values(), self._input_hash_size),
                lengths=feature.lengths(),
                offsets=feature.offsets(),
                weights=feature.weights_or_none(),
            )
            for name, feature in features.items()
        }

    def reset_inference_mode(self) -> None:
        """Forget pending evictions and restart the eviction clock at the next training step."""
        self._evicted = False
        self._last_eviction_iter = -1

    @torch.no_grad()
    def _match_indices(self, sorted_sequence: Tensor, search_values: Tensor) -> tuple[Tensor, Tensor]:
        """``(mask of the values found in sorted_sequence, their positions there)``."""
        position = torch.searchsorted(sorted_sequence[:-1], search_values)
        found = sorted_sequence[position] == search_values
        return found, position[found]

    @torch.no_grad()
    def _sort_mch_buffers(self) -> None:
        """Re-sort the ids ascending, carrying each slot's row and metadata along."""
        order = torch.argsort(self._mch_sorted_raw_ids, stable=True)
        self._mch_sorted_raw_ids.copy_(self._mch_sorted_raw_ids[order])
        self._mch_remapped_ids_mapping.copy_(self._mch_remapped_ids_mapping[order])
        for buffer in self._mch_metadata.values():
            buffer.copy_(buffer[order])

    @torch.no_grad()
    def _update_and_evict(
        self, uniq_ids: Tensor, uniq_ids_counts: Tensor, uniq_ids_metadata: dict[str, Tensor]
    ) -> None:
        """Let the distinct ids of the history compete with the residents; record the rows handed over."""
        by_count = torch.argsort(uniq_ids_counts, descending=True, stable=True)
        ids, counts = uniq_ids[by_count], uniq_ids_counts[by_count]
        resident, slots = self._match_indices(self._mch_sorted_raw_ids, ids)
        newcomers = ids[~resident]
        evicted, chosen = self._eviction_policy.update_metadata_and_generate_eviction_scores(
            self._current_iter,
            self._zch_size,
            by_count,
            counts,
            resident,
            slots,
            self._mch_metadata,
            uniq_ids_metadata,
        )
        self._mch_sorted_raw_ids[evicted] = newcomers[chosen]
        rows = self._mch_remapped_ids_mapping[evicted]
        # Rows handed over since the last evict() accumulate until it is called.
        self._evicted_emb_indices = (
            torch.unique(torch.cat([self._evicted_emb_indices, rows])) if self._evicted else rows
        )
        self._evicted = True
        self._sort_mch_buffers()

    @torch.no_grad()
    def _coalesce_history(self) -> None:
        history = self._history_accumulator[: self._current_history_buffer_offset]
        uniq_ids, inverse, counts = torch.unique(history, return_inverse=True, return_counts=True)
        keep = None
        if self._eviction_policy._threshold_filtering_func is not None:
            keep, _threshold = self._eviction_policy._threshold_filtering_func(counts)
        metadata = self._eviction_policy.coalesce_history_metadata(
            self._current_iter,
            {
                name: buf[: self._current_history_buffer_offset]
                for name, buf in self._history_metadata.items()
            },
            counts,
            inverse,
            threshold_mask=keep,
        )
        if keep is not None:
            uniq_ids, counts = uniq_ids[keep], counts[keep]
        self._update_and_evict(uniq_ids, counts, metadata)
        self._current_history_buffer_offset = 0

    def _record(self, ids: Tensor) -> None:
        """Append ``ids`` to the history (what does not fit until the next eviction is dropped)."""
        start = self._current_history_buffer_offset
        ids = ids[: self._input_history_buffer_size - start]
        end = start + ids.shape[0]
        self._history_accumulator[start:end] = ids
        views = {name: buf[start:end] for name, buf in self._history_metadata.items()}
        self._eviction_policy.record_history_metadata(self._current_iter, ids, views)
        self._current_history_buffer_offset = end

    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        if not self.training:
            return features
        if self._current_iter == -1:
            # First step of this process: continue the count a checkpoint carried.
            self._current_iter = int(self._current_iter_tensor.item())
            self._last_eviction_iter = self._current_iter
        self._current_iter += 1
        self._current_iter_tensor.data += 1
        if self._input_history_buffer_size == -1:
            self._init_history_buffers(features)
        for feature in features.values():
            self._record(feature.values())
        if self._current_iter - self._last_eviction_iter == self._eviction_interval:
            self._coalesce_history()
            self._last_eviction_iter = self._current_iter
        return features

    def remap(
        self,
        features: dict[str, JaggedTensor],
        mutate_miss_lengths: bool = True,
        write_weights: Tensor | None = None,
    ) -> dict[str, JaggedTensor]:
        miss_row = self._output_global_offset + self._zch_size - 1
        return _mch_remap(features, self._mch_sorted_raw_ids, self._mch_remapped_ids_mapping, miss_row)

    def forward(
        self, features: dict[str, JaggedTensor], mutate_miss_lengths: bool = True
    ) -> dict[str, JaggedTensor]:
        return self.remap(self.profile(self.preprocess(features)))

    def output_size(self) -> int:
        return self._zch_size

    def buckets(self) -> int:
        return self._buckets

    def input_size(self) -> int:
        return self._input_hash_size

    def open_slots(self) -> Tensor:
        """Empty slots, not counting the miss row (a tensor of one element)."""
        return self._mch_slots - torch.searchsorted(self._mch_sorted_raw_ids, self._delimiter)

    @torch.no_grad()
    def evict(self) -> Tensor | None:
        if not self._evicted:
            return None
        self._evicted = False
        return self._evicted_emb_indices

    def validate_state(self) -> None:
        start = self._output_global_offset
        end = start + self._zch_size
        if start not in self._output_segments_tensor or end not in self._output_segments_tensor:
            segments = self._output_segments_tensor
            raise ValueError(
                f"{self._name or 'managed collision module'}: rows [{start}, {end}) are not a union of the "
                f"checkpoint's shard segments {segments[segments >= 0].tolist()}"
            )
        # A checkpoint written by another sharding may carry its slots in another order.
        self._sort_mch_buffers()

    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: list[int],
        device: torch.device | None = None,
    ) -> "MCHManagedCollisionModule":
        return type(self)(
            name=self._name,
            zch_size=output_id_range[1] - output_id_range[0],
            device=device or self.device,
            eviction_policy=self._eviction_policy,
            eviction_interval=self._eviction_interval,
            input_hash_size=self._input_hash_size,
            input_hash_func=self._input_hash_func,
            output_global_offset=output_id_range[0],
            output_segments=output_segments,
            buckets=len(output_segments) - 1,
        )
