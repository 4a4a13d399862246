"""Per-row runtime metadata of a ``HashZchManagedCollisionModule`` (``_hash_zch_runtime_meta``).

Either the kernel counts hits per row (``track_id_freq``) or the caller stores ``write_runtime_meta_dim``
int64 columns per row (``remap(..., write_weights=...)``). Either way a row's metadata belongs to the id
that owns the row: it is cleared when the row is handed to another id.
"""

import torch
from torch import Tensor


class HashZchRuntimeMeta:
    """The runtime-metadata methods of ``HashZchManagedCollisionModule`` (a mixin over its state)."""

    _hash_zch_identities: Tensor
    _hash_zch_runtime_meta: Tensor | None
    _write_runtime_meta_dim: int
    _disable_fallback: bool

    def _clear_runtime_meta(self, evictions: Tensor | None) -> None:
        """Custom metadata of rows taken from other ids starts at 0 (the kernel clears counted ones)."""
        meta = self._hash_zch_runtime_meta
        if (
            self._write_runtime_meta_dim > 0
            and meta is not None
            and evictions is not None
            and evictions.numel() > 0
        ):
            meta.data[evictions] = 0

    def lookup_runtime_meta(self, features: Tensor, remapped_ids: Tensor) -> Tensor:
        """Each id's row metadata (0 where the row is not the id's own; -1 for all without metadata)."""
        assert features.numel() == remapped_ids.numel()
        meta = self._hash_zch_runtime_meta
        if meta is None:
            return torch.full_like(remapped_ids, -1)
        not_owner = self._hash_zch_identities[remapped_ids] != features
        found = torch.index_select(meta, 0, remapped_ids)
        found[not_owner] = 0
        return found.reshape(-1)

    def lookup_custom_runtime_meta(self, remapped_ids: Tensor) -> Tensor:
        """The metadata rows of ``remapped_ids`` (``[n, write_runtime_meta_dim]``)."""
        meta = self._hash_zch_runtime_meta
        assert meta is not None, "this module keeps no runtime metadata (write_runtime_meta_dim=0)"
        return torch.index_select(meta, 0, remapped_ids)

    def update_runtime_meta(self, raw_ids: Tensor, remapped_ids: Tensor, weights: Tensor) -> None:
        """Store ``weights`` (``[n]`` or ``[n, dim]``; floats keep their bits) as the metadata of the rows
        the ids own; ids that fell back to a row they do not own write nothing."""
        if weights.dim() == 1:
            weights = weights.unsqueeze(1)
        if not self._disable_fallback:
            owner = torch.flatten(self._hash_zch_identities).data[remapped_ids] == raw_ids
            remapped_ids, weights = remapped_ids[owner], weights[owner]
        meta = self._hash_zch_runtime_meta
        assert meta is not None, "update_runtime_meta needs write_runtime_meta_dim > 0"
        meta.data[remapped_ids] = weights.view(meta.dtype)
