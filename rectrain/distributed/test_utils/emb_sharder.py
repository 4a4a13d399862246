"""``torchrec.distributed.test_utils.emb_sharder``: TorchRec's test sharders, each held to one sharding type
and one compute kernel (a test fixture over rectrain's sharders)."""

from __future__ import annotations

from typing import Any

from rectrain.distributed.parallel.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder


class _OneChoice:
    def __init__(
        self,
        sharding_type: str,
        kernel_type: str,
        fused_params: dict[str, Any] | None = None,
        qcomm_codecs_registry: Any = None,
    ) -> None:
        self._sharding_type, self._kernel_type = sharding_type, kernel_type
        super().__init__(fused_params or {}, qcomm_codecs_registry)  # type: ignore[call-arg]

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [self._sharding_type]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return [self._kernel_type]


class TestECSharder(_OneChoice, EmbeddingCollectionSharder):
    __test__ = False  # a fixture, not a pytest class


class TestEBCSharder(_OneChoice, EmbeddingBagCollectionSharder):
    __test__ = False
