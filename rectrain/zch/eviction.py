"""Eviction policies of ``MCHManagedCollisionModule`` (``torchrec.modules.mc_modules``' policies).

Every ``eviction_interval`` training steps the module gathers the distinct ids seen since the last eviction
and asks its policy which of them enter the table and which resident ids leave. A policy keeps per-slot
metadata (buffers of the module, so they are checkpointed with it) and, optionally, per-id history
recorded as ids arrive. It scores the table's slots and the newcomers on one scale; the ``zch_size``
best-scored entries stay, ties kept in their current order (resident slots first, newcomers by frequency).
The table's last slot is the miss row every unknown id maps to: it always scores highest, so it is never
given away.

Policies (scores: higher stays):
- ``LFU_EvictionPolicy``: the id's total count since it entered the table.
- ``LRU_EvictionPolicy``: ``-(steps since last seen + 1) ** decay_exponent``.
- ``DistanceLFU_EvictionPolicy``: count divided by ``(steps since last seen + 1) ** decay_exponent``.
"""

import abc
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

ThresholdFilter = Callable[[Tensor], tuple[Tensor, float | Tensor]]

_COUNTS = "counts"
_LAST_ACCESS = "last_access_iter"


class MCHEvictionPolicyMetadataInfo(NamedTuple):
    """One metadata tensor a policy keeps: per table slot (``is_mch_metadata``) and/or per arriving id."""

    metadata_name: str
    is_mch_metadata: bool
    is_history_metadata: bool


def _keep_top(pivot: int, scores: Tensor) -> tuple[Tensor, Tensor]:
    """Which slots to free and which newcomers fill them, from scores over ``[slots..., newcomers...]``.

    The ``pivot`` (table size) best scores stay; a stable sort keeps equal scores in their order. Returns
    ``(freed slot positions, newcomer positions)``, equally long and paired in score order.
    """
    ranked = torch.argsort(scores, descending=True, stable=True)
    kept, dropped = ranked[:pivot], ranked[pivot:]
    return dropped[dropped < pivot], kept[kept >= pivot] - pivot


class MCHEvictionPolicy(abc.ABC):
    """Base of the MCH eviction policies; subclasses define the metadata and the scores.

    Args:
        metadata_info: the metadata the policy keeps (see ``MCHEvictionPolicyMetadataInfo``).
        threshold_filtering_func: optional filter over the counts of the distinct ids seen since the last
            eviction (``rectrain.zch.filters``); ids it rejects are not candidates this round.
    """

    def __init__(
        self,
        metadata_info: list[MCHEvictionPolicyMetadataInfo],
        threshold_filtering_func: ThresholdFilter | None = None,
    ) -> None:
        self._metadata_info = metadata_info
        self._threshold_filtering_func = threshold_filtering_func

    @property
    def metadata_info(self) -> list[MCHEvictionPolicyMetadataInfo]:
        return self._metadata_info

    @abc.abstractmethod
    def record_history_metadata(
        self, current_iter: int, incoming_ids: Tensor, history_metadata: dict[str, Tensor]
    ) -> None:
        """Fill the history metadata of ``incoming_ids`` (views into the module's history buffers)."""

    @abc.abstractmethod
    def coalesce_history_metadata(
        self,
        current_iter: int,
        history_metadata: dict[str, Tensor],
        unique_ids_counts: Tensor,
        unique_inverse_mapping: Tensor,
        additional_ids: Tensor | None = None,
        threshold_mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Reduce the history metadata to one value per distinct id (``torch.unique``'s order)."""

    @abc.abstractmethod
    def update_metadata_and_generate_eviction_scores(
        self,
        current_iter: int,
        mch_size: int,
        coalesced_history_argsort_mapping: Tensor,
        coalesced_history_sorted_unique_ids_counts: Tensor,
        coalesced_history_mch_matching_elements_mask: Tensor,
        coalesced_history_mch_matching_indices: Tensor,
        mch_metadata: dict[str, Tensor],
        coalesced_history_metadata: dict[str, Tensor],
    ) -> tuple[Tensor, Tensor]:
        """Update the slots' metadata with the distinct ids (sorted by count, descending) and choose.

        Returns ``(evicted slot positions, positions among the not-yet-resident ids that replace them)``.
        """

    def _compute_selected_eviction_and_replacement_indices(
        self, pivot: int, eviction_scores: Tensor
    ) -> tuple[Tensor, Tensor]:
        return _keep_top(pivot, eviction_scores)


def _last_access_of_unique(
    current_iter: int,
    history_metadata: dict[str, Tensor],
    unique_ids_counts: Tensor,
    unique_inverse_mapping: Tensor,
    additional_ids: Tensor | None,
    threshold_mask: Tensor | None,
) -> dict[str, Tensor]:
    """The latest step each distinct id was seen (``additional_ids`` count as seen now)."""
    seen_at = history_metadata[_LAST_ACCESS]
    if additional_ids is not None:
        seen_at = torch.cat([seen_at, torch.full_like(additional_ids, current_iter)])
    latest = torch.zeros_like(unique_ids_counts).scatter_reduce_(
        0, unique_inverse_mapping, seen_at, reduce="amax", include_self=False
    )
    return {_LAST_ACCESS: latest if threshold_mask is None else latest[threshold_mask]}


def _resident_and_new(values: Tensor, resident: Tensor) -> tuple[Tensor, Tensor]:
    """Split per-distinct-id ``values`` into those of ids already in the table and those of newcomers."""
    return values[resident], values[~resident]


class LFU_EvictionPolicy(MCHEvictionPolicy):  # noqa: N801 - TorchRec's name
    """Keep the most frequently seen ids (counts accumulate while an id stays in the table)."""

    def __init__(self, threshold_filtering_func: ThresholdFilter | None = None) -> None:
        super().__init__([MCHEvictionPolicyMetadataInfo(_COUNTS, True, False)], threshold_filtering_func)

    def record_history_metadata(
        self, current_iter: int, incoming_ids: Tensor, history_metadata: dict[str, Tensor]
    ) -> None:
        """Counts come from the id history itself: nothing to record."""

    def coalesce_history_metadata(
        self,
        current_iter: int,
        history_metadata: dict[str, Tensor],
        unique_ids_counts: Tensor,
        unique_inverse_mapping: Tensor,
        additional_ids: Tensor | None = None,
        threshold_mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        return {}

    def update_metadata_and_generate_eviction_scores(
        self,
        current_iter: int,
        mch_size: int,
        coalesced_history_argsort_mapping: Tensor,
        coalesced_history_sorted_unique_ids_counts: Tensor,
        coalesced_history_mch_matching_elements_mask: Tensor,
        coalesced_history_mch_matching_indices: Tensor,
        mch_metadata: dict[str, Tensor],
        coalesced_history_metadata: dict[str, Tensor],
    ) -> tuple[Tensor, Tensor]:
        counts = mch_metadata[_COUNTS]
        seen, new = _resident_and_new(
            coalesced_history_sorted_unique_ids_counts, coalesced_history_mch_matching_elements_mask
        )
        counts[coalesced_history_mch_matching_indices] += seen
        counts[mch_size - 1] = torch.iinfo(torch.int64).max  # the miss row stays
        evicted, chosen = _keep_top(mch_size, torch.cat([counts, new]))
        counts[evicted] = new[chosen]
        return evicted, chosen


class _LastAccessPolicy(MCHEvictionPolicy):
    """A policy whose history is when each id was last seen (LRU, DistanceLFU): the batch's ids are stamped
    with the iteration and coalesced to one stamp per unique id."""

    def record_history_metadata(
        self, current_iter: int, incoming_ids: Tensor, history_metadata: dict[str, Tensor]
    ) -> None:
        history_metadata[_LAST_ACCESS][:] = current_iter

    def coalesce_history_metadata(
        self,
        current_iter: int,
        history_metadata: dict[str, Tensor],
        unique_ids_counts: Tensor,
        unique_inverse_mapping: Tensor,
        additional_ids: Tensor | None = None,
        threshold_mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        return _last_access_of_unique(
            current_iter,
            history_metadata,
            unique_ids_counts,
            unique_inverse_mapping,
            additional_ids,
            threshold_mask,
        )


class LRU_EvictionPolicy(_LastAccessPolicy):  # noqa: N801 - TorchRec's name
    """Keep the most recently seen ids; ``decay_exponent`` shapes the score, not the order."""

    def __init__(
        self, decay_exponent: float = 1.0, threshold_filtering_func: ThresholdFilter | None = None
    ) -> None:
        super().__init__([MCHEvictionPolicyMetadataInfo(_LAST_ACCESS, True, True)], threshold_filtering_func)
        self._decay_exponent = decay_exponent

    def update_metadata_and_generate_eviction_scores(
        self,
        current_iter: int,
        mch_size: int,
        coalesced_history_argsort_mapping: Tensor,
        coalesced_history_sorted_unique_ids_counts: Tensor,
        coalesced_history_mch_matching_elements_mask: Tensor,
        coalesced_history_mch_matching_indices: Tensor,
        mch_metadata: dict[str, Tensor],
        coalesced_history_metadata: dict[str, Tensor],
    ) -> tuple[Tensor, Tensor]:
        last = mch_metadata[_LAST_ACCESS]
        history = coalesced_history_metadata[_LAST_ACCESS]
        history.copy_(history[coalesced_history_argsort_mapping])  # into the ids' count order
        seen, new = _resident_and_new(history, coalesced_history_mch_matching_elements_mask)
        last[coalesced_history_mch_matching_indices] = seen
        last[mch_size - 1] = current_iter  # the miss row stays
        age = current_iter - torch.cat([last, new]) + 1
        evicted, chosen = _keep_top(mch_size, torch.neg(torch.pow(age, self._decay_exponent)))
        last[evicted] = new[chosen]
        return evicted, chosen


class DistanceLFU_EvictionPolicy(_LastAccessPolicy):  # noqa: N801 - TorchRec's name
    """Keep ids by count divided by ``(steps since last seen + 1) ** decay_exponent``."""

    def __init__(
        self, decay_exponent: float = 1.0, threshold_filtering_func: ThresholdFilter | None = None
    ) -> None:
        super().__init__(
            [
                MCHEvictionPolicyMetadataInfo(_COUNTS, True, False),
                MCHEvictionPolicyMetadataInfo(_LAST_ACCESS, True, True),
            ],
            threshold_filtering_func,
        )
        self._decay_exponent = decay_exponent

    def update_metadata_and_generate_eviction_scores(
        self,
        current_iter: int,
        mch_size: int,
        coalesced_history_argsort_mapping: Tensor,
        coalesced_history_sorted_unique_ids_counts: Tensor,
        coalesced_history_mch_matching_elements_mask: Tensor,
        coalesced_history_mch_matching_indices: Tensor,
        mch_metadata: dict[str, Tensor],
        coalesced_history_metadata: dict[str, Tensor],
    ) -> tuple[Tensor, Tensor]:
        counts, last = mch_metadata[_COUNTS], mch_metadata[_LAST_ACCESS]
        history = coalesced_history_metadata[_LAST_ACCESS]
        history.copy_(history[coalesced_history_argsort_mapping])  # into the ids' count order
        resident = coalesced_history_mch_matching_elements_mask
        seen_counts, new_counts = _resident_and_new(coalesced_history_sorted_unique_ids_counts, resident)
        seen_last, new_last = _resident_and_new(history, resident)
        counts[coalesced_history_mch_matching_indices] += seen_counts
        last[coalesced_history_mch_matching_indices] = seen_last
        counts[mch_size - 1] = torch.iinfo(torch.int64).max  # the miss row stays
        last[mch_size - 1] = current_iter
        distance = torch.pow(current_iter - torch.cat([last, new_last]) + 1, self._decay_exponent)
        evicted, chosen = _keep_top(mch_size, torch.div(torch.cat([counts, new_counts]), distance))
        counts[evicted] = new_counts[chosen]
        last[evicted] = new_last[chosen]
        return evicted, chosen
