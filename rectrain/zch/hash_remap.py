"""The remap of a ``HashZchManagedCollisionModule``: FBGEMM's ``zero_collision_hash`` over each feature's ids
(a mixin over the module's state, in its own file to keep the module's small)."""

import fbgemm_gpu  # noqa: F401 - registers torch.ops.fbgemm
import torch
from torch import Tensor

from rectrain.sparse import JaggedTensor
from rectrain.zch.input_mapper import _compute_lengths_from_hits, _tensor_may_to_device


@torch.fx.wrap
def _append_eviction_indice(evicted_indices: list[Tensor], evictions: Tensor | None) -> None:
    if evictions is not None and evictions.numel() > 0:
        evicted_indices.append(evictions)


class HashZchRemap:
    """``remap`` and its steps; the attributes are ``HashZchManagedCollisionModule``'s."""

    def _zero_collision_hash(
        self,
        input: Tensor,
        readonly: bool,
        local_sizes: Tensor | None,
        offsets: Tensor | None,
        metadata: Tensor | None,
        input_metadata: Tensor | None,
        eviction_threshold: int,
        opt_in_rands: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """FBGEMM's probe: (each id's row, rows taken from other ids)."""
        # Custom metadata columns are written by update_runtime_meta, never counted by the kernel.
        runtime_meta = None if self._write_runtime_meta_dim > 0 else self._hash_zch_runtime_meta
        return torch.ops.fbgemm.zero_collision_hash(
            input=input,
            identities=self._hash_zch_identities,
            max_probe=self._max_probe,
            circular_probe=True,
            exp_hours=-1,
            readonly=readonly,
            local_sizes=local_sizes,
            offsets=offsets,
            metadata=metadata,
            output_on_uvm=False,
            disable_fallback=self._disable_fallback,
            _modulo_identity_DPRECATED=False,
            input_metadata=input_metadata,
            eviction_threshold=eviction_threshold,
            eviction_policy=self.eviction_flag,
            opt_in_prob=self._opt_in_prob,
            num_reserved_slots=self.get_reserved_slots_per_bucket(),
            opt_in_rands=opt_in_rands,
            runtime_meta=runtime_meta,
        )

    def _drop_misses(
        self,
        remapped_ids: Tensor,
        hits: Tensor,
        lengths: Tensor,
        offsets: Tensor | None,
        mutate_lengths: bool,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """With ``disable_fallback``: missed ids leave the feature (or become row 0 with ``no_bag``)."""
        if self._no_bag:
            remapped_ids = torch.where(hits, remapped_ids, 0)
        else:
            remapped_ids = remapped_ids[hits]
        if mutate_lengths:
            # Hits per row, which is right for any lengths (sharded inputs carry the global batch's rows).
            lengths = _compute_lengths_from_hits(lengths, hits)
            offsets = None  # recomputed from the new lengths
        return remapped_ids, lengths, offsets

    def remap(
        self,
        features: dict[str, JaggedTensor],
        mutate_miss_lengths: bool = True,
        write_weights: Tensor | None = None,
    ) -> dict[str, JaggedTensor]:
        if self._output_global_offset_tensor is not None:
            self._output_global_offset_tensor, _ = _tensor_may_to_device(
                self._output_global_offset_tensor, self.device
            )
        metadata: Tensor | None = self._hash_zch_metadata if self.training else None
        # evict() empties this every step; rows of two steps must not mix.
        assert len(self._evicted_indices) == 0, "call evict() after each remap"
        with torch.no_grad():
            logging_on = self._scalar_logger is not None
            identities_0: Tensor | None = self._hash_zch_identities.data.clone() if logging_on else None
            metadata_0: Tensor | None = None
            if logging_on and self._hash_zch_metadata is not None:
                metadata_0 = self._hash_zch_metadata.data.clone()
            remapped: dict[str, JaggedTensor] = {}
            for name, feature in features.items():
                read_only = not self.training or name.lower().endswith(self._read_only_suffix)
                remapped[name] = self._remap_feature(
                    feature,
                    read_only,
                    None if read_only else metadata,
                    mutate_miss_lengths,
                    write_weights,
                    identities_0,
                    metadata_0,
                )
            if self._scalar_logger is not None:
                self._scalar_logger(
                    run_type="train" if self.training else "eval", identities=self._hash_zch_identities.data
                )
            return remapped

    def _remap_feature(
        self,
        feature: JaggedTensor,
        read_only: bool,
        metadata: Tensor | None,
        mutate_miss_lengths: bool,
        write_weights: Tensor | None,
        identities_0: Tensor | None,
        metadata_0: Tensor | None,
    ) -> JaggedTensor:
        values = feature.values()
        input_metadata, threshold = (
            (None, -1) if self._eviction_module is None else self._eviction_module(feature)
        )
        opt_in_rands: Tensor | None = None
        if self._opt_in_prob > 0 and self._opt_in_prob < 100 and self.training:
            opt_in_rands = (torch.rand_like(values, dtype=torch.float) * 100).to(torch.int32)
        values, orig_device = _tensor_may_to_device(values, self.device)
        if not read_only and values.device.type == "cpu":
            raise RuntimeError(
                "HashZchManagedCollisionModule inserts ids on CUDA only (FBGEMM's CPU zero_collision_hash "
                "is read only): on CPU, call reset_inference_mode() or eval() first, or build it with "
                "is_inference=True"
            )
        values, local_sizes, offsets = self.input_mapper(
            values=values, output_offset=self._output_global_offset_tensor
        )
        rows, evictions = self._zero_collision_hash(
            values, read_only, local_sizes, offsets, metadata, input_metadata, threshold, opt_in_rands
        )
        self._clear_runtime_meta(evictions)
        if write_weights is not None:
            self.update_runtime_meta(values, rows, write_weights)
        lengths = feature.lengths()
        row_offsets: Tensor | None = feature.offsets()
        hits = rows != -1
        if self._disable_fallback:
            rows, lengths, row_offsets = self._drop_misses(
                rows, hits, lengths, row_offsets, mutate_miss_lengths
            )
        if self._scalar_logger is not None:
            assert identities_0 is not None
            self._scalar_logger.update(
                identities_0=identities_0,
                identities_1=self._hash_zch_identities,
                values=values,
                remapped_ids=rows,
                hit_indices=hits,
                evicted_emb_indices=evictions,
                metadata=metadata_0,
                eviction_config=self._eviction_config,
            )
        if self._output_global_offset_tensor is not None:
            rows = rows + self._output_global_offset_tensor
        _append_eviction_indice(self._evicted_indices, evictions)
        rows, _ = _tensor_may_to_device(rows, orig_device)
        return JaggedTensor(
            values=rows, lengths=lengths, offsets=row_offsets, weights=feature.weights_or_none()
        )
