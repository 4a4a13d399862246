"""``torchrec.distributed.test_utils.model_input``: TorchRec's random batches for tests and benchmarks.

``ModelInput`` is one batch (dense features, unweighted and weighted ``KeyedJaggedTensor`` s, labels, extra
"dummy" tensors); its generators draw the same distributions as TorchRec's (lengths ~ N(pooling, pooling/10)
clamped to >= 1 and the table's max length; ids uniform, or a power law ``f(x) ~ 1/x^alpha`` by inverse
CDF), so tests written against TorchRec's inputs see the same shapes here. ``VariableBatchModelInput`` draws
variable-batch (VBE) features. The batches are plain data; nothing here is engine code.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rectrain.sparse import KeyedJaggedTensor

Tables = Sequence[Any]  # EmbeddingBagConfig / EmbeddingConfig / EmbeddingTableConfig: name, rows, features


def _rows(table: Any) -> int:
    return getattr(table, "num_embeddings_post_pruning", None) or table.num_embeddings


def _rand(shape: tuple[int, ...], zeros: bool, device: torch.device | None) -> torch.Tensor:
    return torch.zeros(shape, device=device) if zeros else torch.rand(shape, device=device)


@dataclass
class ModelInput:
    """One batch for a simple RecSys model (TorchRec's ``ModelInput``)."""

    float_features: torch.Tensor
    idlist_features: KeyedJaggedTensor | None
    idscore_features: KeyedJaggedTensor | None
    label: torch.Tensor
    dummy: list[torch.Tensor] = field(default_factory=list)

    def _map(self, dense: Any, sparse: Any) -> ModelInput:
        kjt = [None if f is None else sparse(f) for f in (self.idlist_features, self.idscore_features)]
        return type(self)(
            dense(self.float_features), kjt[0], kjt[1], dense(self.label), [dense(d) for d in self.dummy]
        )

    def to(
        self,
        device: torch.device,
        non_blocking: bool = False,
        data_copy_stream: torch.Stream | None = None,
        dense_only: bool = False,
    ) -> ModelInput:
        """A copy on ``device`` (sparse features stay put with ``dense_only``); with ``data_copy_stream``
        the copies are issued on that stream after it waits for the current one."""

        def move(x: Any) -> Any:
            return x.to(device=device, non_blocking=non_blocking)

        if data_copy_stream is None:
            return self._map(move, (lambda x: x) if dense_only else move)
        module = torch.get_device_module(device)
        with module.stream(data_copy_stream):
            data_copy_stream.wait_stream(module.current_stream(device))
            return self._map(move, (lambda x: x) if dense_only else move)

    def record_stream(self, stream: torch.Stream) -> None:
        self._map(lambda x: x.record_stream(stream), lambda x: x.record_stream(stream))

    def size_in_bytes(self) -> int:
        dense = [self.float_features, self.label, *self.dummy]
        sparse = [f.size_in_bytes() for f in (self.idlist_features, self.idscore_features) if f is not None]
        return sum(t.element_size() * t.numel() for t in dense) + sum(sparse)

    def pin_memory(self) -> ModelInput:
        return self._map(lambda x: x.pin_memory(), lambda x: x.pin_memory())

    @classmethod
    def generate(
        cls,
        batch_size: int = 1,
        tables: Tables | None = None,
        weighted_tables: Tables | None = None,
        num_float_features: int = 16,
        pooling_avg: int = 10,
        tables_pooling: list[int] | None = None,
        max_feature_lengths: list[int] | None = None,
        use_offsets: bool = False,
        device: torch.device | None = None,
        indices_dtype: torch.dtype = torch.int64,
        offsets_dtype: torch.dtype = torch.int64,
        lengths_dtype: torch.dtype = torch.int64,
        all_zeros: bool = False,
        pin_memory: bool = False,
        power_law_alpha: float | None = None,
        num_dummy_tensor: int = 0,
    ) -> ModelInput:
        """One batch of ``batch_size`` rows; a feature group is ``None`` when it has no tables."""
        float_features = _rand((batch_size, num_float_features), all_zeros, device)
        kw = dict(
            pooling_avg=pooling_avg, tables_pooling=tables_pooling, max_feature_lengths=max_feature_lengths
        )
        kw.update(use_offsets=use_offsets, device=device, indices_dtype=indices_dtype, all_zeros=all_zeros)
        kw.update(offsets_dtype=offsets_dtype, lengths_dtype=lengths_dtype, power_law_alpha=power_law_alpha)
        kjts = [
            cls.create_standard_kjt(batch_size, group, weighted=weighted, **kw) if group else None
            for group, weighted in ((tables, False), (weighted_tables, True))
        ]
        label = _rand((batch_size,), all_zeros, device)
        dummy = [torch.rand((batch_size, num_float_features), device=device) for _ in range(num_dummy_tensor)]
        batch = cls(float_features, kjts[0], kjts[1], label, dummy)
        return batch.pin_memory() if pin_memory else batch

    @classmethod
    def generate_local_batches(cls, world_size: int, batch_size: int = 1, **kwargs: Any) -> list[ModelInput]:
        """``world_size`` independent batches (``generate``'s arguments)."""
        return [cls.generate(batch_size=batch_size, **kwargs) for _ in range(world_size)]

    @classmethod
    def generate_global_and_local_batches(
        cls,
        world_size: int,
        batch_size: int = 1,
        tables: Tables | None = None,
        weighted_tables: Tables | None = None,
        num_float_features: int = 16,
        pooling_avg: int = 10,
        tables_pooling: list[int] | None = None,
        max_feature_lengths: list[int] | None = None,
        use_offsets: bool = False,
        device: torch.device | None = None,
        indices_dtype: torch.dtype = torch.int64,
        offsets_dtype: torch.dtype = torch.int64,
        lengths_dtype: torch.dtype = torch.int64,
        all_zeros: bool = False,
        num_dummy_tensor: int = 0,
    ) -> tuple[ModelInput, list[ModelInput]]:
        """A global batch of ``world_size * batch_size`` rows and the per-rank batches it is made of."""
        rows = [_rand((batch_size, num_float_features), all_zeros, device) for _ in range(world_size)]
        draw = dict(
            pooling_avg=pooling_avg, tables_pooling=tables_pooling, max_feature_lengths=max_feature_lengths
        )
        draw.update(
            device=device, indices_dtype=indices_dtype, lengths_dtype=lengths_dtype, all_zeros=all_zeros
        )
        build = dict(device=device, use_offsets=use_offsets, offsets_dtype=offsets_dtype)
        global_kjts, local_kjts = [], []
        for group, weighted in ((tables, False), (weighted_tables, True)):
            if not group:
                global_kjts.append(None)
                local_kjts.append([None] * world_size)
                continue
            per_rank = [
                cls._create_features_lengths_indices(batch_size, group, **draw) for _ in range(world_size)
            ]
            keys = per_rank[0][0]
            local_kjts.append([cls._assemble_kjt(keys, ln, ix, weighted, **build) for _, ln, ix in per_rank])
            # the global batch holds each feature's rows rank after rank
            lengths = [per_rank[r][1][f] for f in range(len(keys)) for r in range(world_size)]
            indices = [per_rank[r][2][f] for f in range(len(keys)) for r in range(world_size)]
            global_kjts.append(cls._assemble_kjt(keys, lengths, indices, weighted, **build))
        labels = [_rand((batch_size,), all_zeros, device) for _ in range(world_size)]
        dummies = [
            [torch.rand((batch_size, num_float_features), device=device) for _ in range(num_dummy_tensor)]
            for _ in range(world_size)
        ]
        global_dummy = [torch.cat([d[i] for d in dummies]) for i in range(num_dummy_tensor)]
        global_input = cls(torch.cat(rows), global_kjts[0], global_kjts[1], torch.cat(labels), global_dummy)
        local = [cls(*parts) for parts in zip(rows, local_kjts[0], local_kjts[1], labels, dummies)]
        return global_input, local

    @staticmethod
    def _generate_power_law_indices(
        alpha: float,
        num_indices: int,
        num_embeddings: int,
        dtype: torch.dtype,
        device: torch.device | None,
        seed: int | None = None,
    ) -> torch.Tensor:
        """``num_indices`` ids in ``[0, num_embeddings)`` with ``P(x) ~ 1/(x+1)^alpha`` (inverse-CDF sampling;
        ``alpha`` within 2e-3 of 1 is log-uniform; above 1, draws past the table are redrawn)."""
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if num_embeddings < 1:
            raise ValueError(f"num_embeddings must be >= 1, got {num_embeddings}")
        if num_embeddings == 1:
            return torch.zeros(num_indices, dtype=dtype, device=device)
        if alpha == 0.0:
            return torch.randint(0, num_embeddings, (num_indices,), dtype=dtype, device=device)

        def draw(n: int) -> torch.Tensor:
            u = torch.rand(n, device=device).clamp(1e-10, 1 - 1e-10)
            if abs(alpha - 1.0) < 2e-3:
                return (num_embeddings**u - 1).long()
            if alpha < 1.0:
                return ((u * (num_embeddings ** (1 - alpha) - 1) + 1) ** (1 / (1 - alpha)) - 1).long()
            return ((1 - u) ** (-1 / (alpha - 1)) - 1).long()

        indices = draw(num_indices)
        while (mask := indices >= num_embeddings).any():
            indices[mask] = draw(int(mask.sum()))
        return indices.clamp(0, num_embeddings - 1).to(dtype)  # an overflowing draw casts to a negative id

    @staticmethod
    def _create_features_lengths_indices(
        batch_size: int,
        tables: Tables,
        pooling_avg: int = 10,
        tables_pooling: list[int] | None = None,
        max_feature_lengths: list[int] | None = None,
        device: torch.device | None = None,
        indices_dtype: torch.dtype = torch.int64,
        lengths_dtype: torch.dtype = torch.int64,
        all_zeros: bool = False,
        power_law_alpha: float | None = None,
    ) -> tuple[list[str], list[torch.Tensor], list[torch.Tensor]]:
        """Feature names and, per feature, ``batch_size`` lengths and their ids."""
        keys, lengths, indices = [], [], []
        for t, table in enumerate(tables):
            pooling = tables_pooling[t] if tables_pooling is not None else pooling_avg
            cap = max_feature_lengths[t] if max_feature_lengths is not None else None
            for name in table.feature_names:
                keys.append(name)
                drawn = torch.normal(pooling, pooling / 10, [batch_size], device=device)
                ln = torch.max(drawn, torch.tensor(1.0, device=device)).to(lengths_dtype)
                ln = torch.clamp(ln, max=cap) if cap else ln
                n, rows = int(ln.sum().item()), _rows(table)
                if all_zeros:
                    ids = torch.zeros((n,), dtype=indices_dtype, device=device)
                elif power_law_alpha is not None:
                    ids = ModelInput._generate_power_law_indices(
                        power_law_alpha, n, rows, indices_dtype, device
                    )
                else:
                    ids = torch.randint(0, rows, (n,), dtype=indices_dtype, device=device)
                lengths.append(ln)
                indices.append(ids)
        return keys, lengths, indices

    @staticmethod
    def _assemble_kjt(
        features: list[str],
        lengths_per_feature: list[torch.Tensor],
        indices_per_feature: list[torch.Tensor],
        weighted: bool = False,
        device: torch.device | None = None,
        use_offsets: bool = False,
        offsets_dtype: torch.dtype = torch.int64,
    ) -> KeyedJaggedTensor:
        lengths, indices = torch.cat(lengths_per_feature), torch.cat(indices_per_feature)
        weights = torch.rand((indices.numel(),), device=device) if weighted else None
        if not use_offsets:
            return KeyedJaggedTensor(features, indices, weights, lengths)
        offsets = torch.cat([torch.tensor([0], device=device), lengths.cumsum(0)]).to(offsets_dtype)
        return KeyedJaggedTensor(features, indices, weights, offsets=offsets)

    @staticmethod
    def create_standard_kjt(
        batch_size: int,
        tables: Tables,
        pooling_avg: int = 10,
        tables_pooling: list[int] | None = None,
        weighted: bool = False,
        max_feature_lengths: list[int] | None = None,
        use_offsets: bool = False,
        device: torch.device | None = None,
        indices_dtype: torch.dtype = torch.int64,
        offsets_dtype: torch.dtype = torch.int64,
        lengths_dtype: torch.dtype = torch.int64,
        all_zeros: bool = False,
        power_law_alpha: float | None = None,
    ) -> KeyedJaggedTensor:
        """One ``KeyedJaggedTensor`` of ``batch_size`` rows over the tables' features."""
        keys, lengths, indices = ModelInput._create_features_lengths_indices(
            batch_size, tables, pooling_avg, tables_pooling, max_feature_lengths, device, indices_dtype,
            lengths_dtype, all_zeros, power_law_alpha,
        )  # fmt: skip
        return ModelInput._assemble_kjt(keys, lengths, indices, weighted, device, use_offsets, offsets_dtype)


@dataclass
class VariableBatchModelInput(ModelInput):
    """A batch whose features each have their own (deduplicated) batch size, with inverse indices (VBE)."""

    @classmethod
    def generate(  # type: ignore[override]  # TorchRec's signature
        cls,
        batch_size: int = 1,
        num_float_features: int = 16,
        dedup_factor: int = 2,
        tables: Tables | None = None,
        weighted_tables: Tables | None = None,
        pooling_avg: int = 10,
        tables_pooling: list[int] | None = None,
        max_feature_lengths: list[int] | None = None,
        use_offsets: bool = False,
        indices_dtype: torch.dtype = torch.int64,
        offsets_dtype: torch.dtype = torch.int64,
        lengths_dtype: torch.dtype = torch.int64,
        all_zeros: bool = False,
        device: torch.device | None = None,
        pin_memory: bool = False,
        num_dummy_tensor: int = 0,
    ) -> VariableBatchModelInput:
        """``batch_size`` is the average per feature; the batch has ``dedup_factor * batch_size`` rows."""
        rows = dedup_factor * batch_size
        kw = dict(use_offsets=use_offsets, indices_dtype=indices_dtype, offsets_dtype=offsets_dtype)
        kw.update(lengths_dtype=lengths_dtype, device=device)
        kjts = [
            cls._create_variable_batch_kjt(group, batch_size, dedup_factor, **kw) if group else None
            for group in (tables, weighted_tables)
        ]
        float_features = torch.rand((rows, num_float_features), device=device)
        label = torch.rand((rows,), device=device)
        dummy = [torch.rand((rows, num_float_features), device=device) for _ in range(num_dummy_tensor)]
        batch = cls(float_features, kjts[0], kjts[1], label, dummy)
        return batch.pin_memory() if pin_memory else batch

    @staticmethod
    def _create_variable_batch_kjt(
        tables: Tables,
        average_batch_size: int,
        dedup_factor: int,
        use_offsets: bool = False,
        indices_dtype: torch.dtype = torch.int64,
        offsets_dtype: torch.dtype = torch.int64,
        lengths_dtype: torch.dtype = torch.int64,
        device: torch.device | None = None,
    ) -> KeyedJaggedTensor:
        weighted = bool(tables) and getattr(tables[0], "is_weighted", False)
        rows = {name: _rows(table) for table in tables for name in table.feature_names}
        lengths, values, strides, inverse = [], [], [], []
        for num_embeddings in rows.values():
            stride = random.randint(1, average_batch_size * dedup_factor - 1)
            ln = torch.randint(0, 5, (stride,), dtype=lengths_dtype, device=device)
            lengths.append(ln)
            values.append(
                torch.randint(0, num_embeddings, (int(ln.sum()),), dtype=indices_dtype, device=device)
            )
            strides.append([stride])
            full = (dedup_factor * average_batch_size,)
            inverse.append(torch.randint(0, stride, full, dtype=indices_dtype, device=device))
        keys, all_values, all_lengths = list(rows), torch.cat(values), torch.cat(lengths)
        weights = torch.rand(all_values.numel(), device=device) if weighted else None
        jagged: dict[str, Any] = {"lengths": all_lengths}
        if use_offsets:
            zero = torch.tensor([0], dtype=offsets_dtype, device=device)
            jagged = {"offsets": torch.cat([zero, all_lengths.cumsum(0)])}
        return KeyedJaggedTensor(
            keys=keys,
            values=all_values,
            weights=weights,
            stride_per_key_per_rank=strides,
            inverse_indices=(keys, torch.stack(inverse)),
            **jagged,
        )
