"""``torchrec.distributed.model_tracker.delta_store``: per-table lists of batches' lookups, compacted to
unique rows on demand.

rectrain's own delta publishing (``rectrain.train.touched.TouchedRows``) needs ids only and keeps one bitmap
per table; this store is TorchRec's for trackers that also keep each id's embedding or optimizer state per
batch (``UpdateMode.FIRST`` / ``LAST``) and compact batch ranges, which a bitmap cannot.
"""

from __future__ import annotations

from bisect import bisect_left

import torch

from rectrain.distributed.model_tracker.types import IndexedLookup, UniqueRows, UpdateMode


def _compute_unique_rows(
    ids: list[torch.Tensor], states: list[torch.Tensor] | None, mode: UpdateMode
) -> UniqueRows:
    """The unique ids of ``ids`` (concatenated) and, unless ``mode`` is NONE, each one's first/last state."""
    if mode == UpdateMode.NONE:
        assert states is None, f"{mode=} == UpdateMode.NONE but received embeddings"
        return UniqueRows(ids=torch.cat(ids).unique(), states=None)
    assert states is not None, f"{mode=} != UpdateMode.NONE but received no embeddings"
    cat_ids, cat_states = torch.cat(ids), torch.cat(states)
    if mode == UpdateMode.LAST:  # the last occurrence is the first one of the reversed order
        cat_ids, cat_states = cat_ids.flip(0), cat_states.flip(0)
    unique_ids, inverse = cat_ids.unique(sorted=False, return_inverse=True)
    first = torch.full((unique_ids.numel(),), cat_ids.numel(), dtype=torch.int64, device=cat_ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(cat_ids.numel(), device=cat_ids.device), "amin")
    return UniqueRows(ids=unique_ids, states=cat_states[first])


class DeltaStore:
    """TorchRec's interface of a delta store: ``append``, ``delete``, ``compact``, ``get_unique``."""

    def __init__(self, updateMode: UpdateMode = UpdateMode.NONE) -> None:  # noqa: N803 - TorchRec's name
        self.updateMode = updateMode


class DeltaStoreTrec(DeltaStore):
    """Lookups per table FQN, in batch order, compacted to ``UniqueRows`` by ``updateMode``."""

    def __init__(self, updateMode: UpdateMode = UpdateMode.NONE) -> None:  # noqa: N803
        super().__init__(updateMode)
        self.per_fqn_lookups: dict[str, list[IndexedLookup]] = {}

    def append(
        self,
        batch_idx: int,
        fqn: str,
        ids: torch.Tensor,
        states: torch.Tensor | None = None,
        raw_ids: torch.Tensor | None = None,
        runtime_meta: torch.Tensor | None = None,
    ) -> None:
        self.per_fqn_lookups.setdefault(fqn, []).append(IndexedLookup(batch_idx, ids, states))

    def delete(self, up_to_idx: int | None = None) -> None:
        """Drop every lookup (``None``) or those of batches before ``up_to_idx``."""
        if up_to_idx is None:
            self.per_fqn_lookups = {}
            return
        for fqn, lookups in self.per_fqn_lookups.items():
            self.per_fqn_lookups[fqn] = [x for x in lookups if x.batch_idx >= up_to_idx]

    def _range(self, lookups: list[IndexedLookup], start_idx: int, end_idx: int) -> tuple[int, int]:
        indices = [x.batch_idx for x in lookups]
        return bisect_left(indices, start_idx), bisect_left(indices, end_idx)

    def _unique(self, lookups: list[IndexedLookup]) -> UniqueRows:
        states = None if self.updateMode == UpdateMode.NONE else [x.states for x in lookups]
        return _compute_unique_rows([x.ids for x in lookups], states, self.updateMode)

    def compact(self, start_idx: int, end_idx: int) -> None:
        """Replace each table's lookups of batches in ``[start_idx, end_idx)`` by one of their unique rows."""
        assert start_idx < end_idx, f"start_idx {start_idx} must be smaller then end_idx, but got {end_idx}"
        for fqn, lookups in self.per_fqn_lookups.items():
            left, right = self._range(lookups, start_idx, end_idx)
            if right - left > 1:
                rows = self._unique(lookups[left:right])
                merged = IndexedLookup(batch_idx=start_idx, ids=rows.ids, states=rows.states)
                self.per_fqn_lookups[fqn] = [*lookups[:left], merged, *lookups[right:]]

    def get_indexed_lookups(self, start_idx: int, end_idx: int) -> dict[str, list[IndexedLookup]]:
        return {fqn: x[slice(*self._range(x, start_idx, end_idx))] for fqn, x in self.per_fqn_lookups.items()}

    def get_unique(self, from_idx: int = 0) -> dict[str, UniqueRows]:
        """Each table's unique rows over the batches from ``from_idx`` on."""
        return {
            fqn: self._unique([x for x in lookups if x.batch_idx >= from_idx])
            for fqn, lookups in self.per_fqn_lookups.items()
        }
