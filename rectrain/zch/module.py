"""``ManagedCollisionModule``: the interface of a remapper of one table (``torchrec``'s base class).

A remapper maps each input id of its table's features to a row in ``[0, output_size())`` (offset by its
shard's first row when sharded). Its state lives in buffers, so ``state_dict()`` checkpoints it with the
table. ``output_segments`` are the row boundaries of the shards the table may be split into; they are
checkpointed too, so a checkpoint can be checked against the sharding it is loaded into.
"""

import abc

import torch
from torch import Tensor, nn

from rectrain.sparse import JaggedTensor

_MAX_SEGMENTS = 1025  # 1024 row-wise shards; TorchRec's fixed buffer size (checkpoints carry it)


def _validate_after_load(module: "ManagedCollisionModule", incompatible_keys: object) -> None:
    # A module-level function, not a closure: a module holding it still pickles (torch.save(model)).
    module.validate_state()


class ManagedCollisionModule(nn.Module):
    """Maps the ids of one table's features into its rows; subclasses hold the mapping.

    Args:
        device: where the module's state lives and its lookups run.
        output_segments: row boundaries of the table's shards (``[start, end]`` unsharded).
        skip_state_validation: keep no segment buffers and skip the post-load check (for remappers whose
            state is not checked on load).
        read_only_suffix: features whose name ends with it are remapped without updating the mapping.
        enable_per_feature_lookups: remap each feature of a table separately (kept for subclasses).
    """

    def __init__(
        self,
        device: torch.device,
        output_segments: list[int],
        skip_state_validation: bool = False,
        read_only_suffix: str = "_readonly",
        enable_per_feature_lookups: bool = False,
    ) -> None:
        super().__init__()
        self._device = device
        self._enable_per_feature_lookups = enable_per_feature_lookups
        self._read_only_suffix = read_only_suffix
        if skip_state_validation:
            return
        if len(output_segments) > _MAX_SEGMENTS:
            raise ValueError(
                f"a managed collision module spans at most {_MAX_SEGMENTS - 1} row-wise shards; "
                f"got {len(output_segments) - 1} segments"
            )
        padded = output_segments + [-1] * (_MAX_SEGMENTS - len(output_segments))
        self.register_buffer(
            "_output_segments_tensor", torch.tensor(padded, dtype=torch.int64, device=device)
        )
        self.register_buffer("_current_iter_tensor", torch.tensor([0], dtype=torch.int64, device=device))
        self.register_load_state_dict_post_hook(_validate_after_load)

    @property
    def readable_suffix(self) -> str:
        return self._read_only_suffix

    @property
    def device(self) -> torch.device:
        return self._device

    @abc.abstractmethod
    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Transform raw ids before remapping (e.g. hash them into ``input_size()``)."""

    @abc.abstractmethod
    def evict(self) -> Tensor | None:
        """Rows whose id changed since the last call (their embeddings are stale), or None."""

    @abc.abstractmethod
    def remap(
        self,
        features: dict[str, JaggedTensor],
        mutate_miss_lengths: bool = True,
        write_weights: Tensor | None = None,
    ) -> dict[str, JaggedTensor]:
        """The features with their ids replaced by rows."""

    @abc.abstractmethod
    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        """Record the ids (training only) and update the mapping when it is due."""

    @abc.abstractmethod
    def forward(
        self, features: dict[str, JaggedTensor], mutate_miss_lengths: bool = True
    ) -> dict[str, JaggedTensor]:
        """preprocess, profile, remap."""

    @abc.abstractmethod
    def output_size(self) -> int:
        """Rows this module maps into (must equal the table's ``num_embeddings``)."""

    @abc.abstractmethod
    def input_size(self) -> int:
        """Range of the input ids (used to route ids to row-wise shards)."""

    @abc.abstractmethod
    def buckets(self) -> int:
        """Uniform buckets the rows are split into (the unit of resharding)."""

    @abc.abstractmethod
    def validate_state(self) -> None:
        """Check (and re-derive) the state after ``load_state_dict``."""

    @abc.abstractmethod
    def open_slots(self) -> Tensor:
        """Rows not holding an id yet."""

    @abc.abstractmethod
    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: list[int],
        device: torch.device | None = None,
    ) -> "ManagedCollisionModule":
        """The same remapper over the rows ``[start, end)`` of one shard."""
