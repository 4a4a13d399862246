"""``HashZchManagedCollisionModule``: multi-probe zero-collision hashing (``torchrec``'s MPZCH module).

The table keeps, per row, the id that owns it (``_hash_zch_identities``, -1 when free) and, with an eviction
policy, the hour that id expires (``_hash_zch_metadata``). FBGEMM's ``zero_collision_hash`` kernel probes
from an id's hash position within its bucket (``input_mapper``): it returns the row the id owns, or claims a
free or expired row for it in training; with no row for it, the id falls back to the row it hashed to (or
-1 with ``disable_fallback``). Rows claimed from other ids are reported by ``evict()``. In eval or inference
mode the table is read only.

FBGEMM's CPU kernel only reads (as under TorchRec, whose CPU runs fail inside the kernel): training, which
inserts ids, runs on CUDA; on CPU a training-mode remap is refused with a message saying so.
"""

import logging
import math

import fbgemm_gpu  # noqa: F401 - registers torch.ops.fbgemm
import torch
from torch import Tensor

from rectrain.modules.hash_mc_metrics import ScalarLogger
from rectrain.sparse import JaggedTensor
from rectrain.zch.hash_evictions import (
    HashZchEvictionConfig,
    HashZchEvictionModule,
    HashZchEvictionPolicyName,
    get_kernel_from_policy,
)
from rectrain.zch.hash_remap import HashZchRemap
from rectrain.zch.hash_runtime_meta import HashZchRuntimeMeta
from rectrain.zch.input_mapper import TrainInputMapper
from rectrain.zch.module import ManagedCollisionModule

logger = logging.getLogger(__name__)


@torch.fx.wrap
def _get_device(hash_zch_identities: Tensor) -> torch.device:
    return hash_zch_identities.device


def _uniform_segments(zch_size: int, total_num_buckets: int) -> list[int]:
    if zch_size % total_num_buckets != 0:
        raise ValueError(
            f"zch_size {zch_size} is not a multiple of total_num_buckets {total_num_buckets}; "
            "pass output_segments for uneven buckets"
        )
    return [(zch_size // total_num_buckets) * bucket for bucket in range(total_num_buckets + 1)]


def _first_row(row: int, device: torch.device) -> Tensor | None:
    """This shard's first row as a tensor to add to its rows, or None for the first shard."""
    if row == 0:
        return None
    return torch.tensor(
        [row], dtype=torch.int64, device=device if device.type != "meta" else torch.device("cpu")
    )


def _bucket_mapper(
    input_hash_size: int, buckets: int, segments: list[int], divide: bool, name: str | None
) -> TrainInputMapper:
    sizes = torch.diff(torch.tensor(segments, dtype=torch.int64))
    starts = torch.ops.fbgemm.asynchronous_exclusive_cumsum(sizes)
    return TrainInputMapper(input_hash_size, buckets, sizes, starts, divide, name)


class HashZchManagedCollisionModule(HashZchRemap, HashZchRuntimeMeta, ManagedCollisionModule):
    """Maps ids to the rows of a ``zch_size``-row table by multi-probe hashing within buckets.

    Args (TorchRec's): zch_size (rows here), device, total_num_buckets (a divisor of zch_size and a
    multiple of the world size), max_probe (rows probed per id), input_hash_size (id range; 0: unknown),
    output_segments (bucket boundaries; default uniform), is_inference (read only, no eviction metadata),
    name, tb_logging_frequency (steps between ``ScalarLogger`` reports; needs ``name``),
    eviction_policy_name / eviction_config (``hash_evictions``), inference_dispatch_div_train_world_size,
    start_bucket / end_bucket (this shard's buckets), opt_in_prob / percent_reserved_slots (ids admitted to
    the bucket's main rows with that probability in percent, the rest to reserved rows), disable_fallback
    (misses get -1 and are dropped), track_id_freq (count hits per row), read_only_suffix,
    enable_per_feature_lookups, no_bag (keep missed ids as row 0 instead of dropping them),
    write_runtime_meta_dim (int64 columns of custom per-row metadata), persist_hash_zch_bucket (keep the
    bucket count in ``state_dict``).
    """

    _evicted_indices: list[Tensor]

    IDENTITY_BUFFER: str = "_hash_zch_identities"
    METADATA_BUFFER: str = "_hash_zch_metadata"
    BUCKET_BUFFER: str = "_hash_zch_bucket"
    RUNTIME_META_BUFFER: str = "_hash_zch_runtime_meta"

    def __init__(
        self,
        zch_size: int,
        device: torch.device,
        total_num_buckets: int,
        max_probe: int = 128,
        input_hash_size: int = 0,
        output_segments: list[int] | None = None,
        is_inference: bool = False,
        name: str | None = None,
        tb_logging_frequency: int = 0,
        eviction_policy_name: HashZchEvictionPolicyName | None = None,
        eviction_config: HashZchEvictionConfig | None = None,
        inference_dispatch_div_train_world_size: bool = False,
        start_bucket: int = 0,
        end_bucket: int | None = None,
        opt_in_prob: int = -1,
        percent_reserved_slots: float = 0,
        disable_fallback: bool = False,
        track_id_freq: bool = False,
        read_only_suffix: str = "_readonly",
        enable_per_feature_lookups: bool = False,
        no_bag: bool = False,
        write_runtime_meta_dim: int = 0,
        persist_hash_zch_bucket: bool = True,
    ) -> None:
        if output_segments is None:
            output_segments = _uniform_segments(zch_size, total_num_buckets)
        # No segment buffers: the checkpoint of a hash table is its identities (TorchRec's choice too).
        super().__init__(device=device, output_segments=output_segments, skip_state_validation=True)
        self._check_options(opt_in_prob, percent_reserved_slots, track_id_freq, write_runtime_meta_dim)
        self._zch_size = zch_size
        self._output_segments = output_segments
        self._start_bucket = start_bucket
        self._end_bucket = end_bucket if end_bucket is not None else total_num_buckets
        self._output_global_offset_tensor: Tensor | None = _first_row(output_segments[start_bucket], device)
        self._device = device
        self._input_hash_size = input_hash_size
        self._is_inference = is_inference
        self._name = name
        self._eviction_policy_name = eviction_policy_name
        self._eviction_config = eviction_config
        self._eviction_module: HashZchEvictionModule | None = self._new_eviction_module()
        self._opt_in_prob = opt_in_prob
        self._percent_reserved_slots = percent_reserved_slots
        self._write_runtime_meta_dim = write_runtime_meta_dim
        self._disable_fallback = disable_fallback
        self._track_id_freq = track_id_freq
        self._tb_logging_frequency = 0 if (is_inference or name is None) else tb_logging_frequency
        self._scalar_logger: ScalarLogger | None = None
        if self._tb_logging_frequency > 0 and device.type != "meta":
            self._scalar_logger = self._create_scalar_logger()
        self._register_state(total_num_buckets, persist_hash_zch_bucket)
        self._max_probe = max_probe
        self._buckets = total_num_buckets
        self._persist_hash_zch_bucket = persist_hash_zch_bucket
        self._evicted_indices = []  # filled by remap, emptied by evict() every step
        self.input_mapper: torch.nn.Module = _bucket_mapper(
            input_hash_size, total_num_buckets, output_segments, inference_dispatch_div_train_world_size, name
        )
        if is_inference:
            self.reset_inference_mode()
        self._eviction_policy_name_copy = eviction_policy_name
        self._read_only_suffix = read_only_suffix
        self._enable_per_feature_lookups = enable_per_feature_lookups
        self._no_bag = no_bag

    @staticmethod
    def _check_options(opt_in_prob: int, percent_reserved: float, track_id_freq: bool, meta_dim: int) -> None:
        if not 0 <= percent_reserved < 100:
            raise ValueError(f"percent_reserved_slots must be in [0, 100), got {percent_reserved}")
        if opt_in_prob > 0 and percent_reserved <= 0:
            raise ValueError("percent_reserved_slots must be positive when opt_in_prob is positive")
        # AssertionError, as TorchRec (its tests expect that type).
        assert not (track_id_freq and meta_dim > 0), (
            "_hash_zch_runtime_meta holds either id frequencies (track_id_freq) or custom metadata "
            f"(write_runtime_meta_dim), not both; got {track_id_freq=} and {meta_dim=}"
        )

    def _new_eviction_module(self) -> HashZchEvictionModule | None:
        if self._eviction_policy_name is None or not self.training:
            return None
        return HashZchEvictionModule(self._eviction_policy_name, self._device, self._eviction_config)

    def _register_state(self, total_num_buckets: int, persist_bucket: bool) -> None:
        identities, metadata = torch.ops.fbgemm.create_zch_buffer(
            size=self._zch_size,
            support_evict=self._eviction_module is not None,
            device=self._device,
            long_type=True,
        )
        # A parameter without gradient, as TorchRec (its publishing path reads parameters).
        self._hash_zch_identities = torch.nn.Parameter(identities, requires_grad=False)
        self.register_buffer(self.METADATA_BUFFER, metadata)
        self._hash_zch_runtime_meta: Tensor | None = None
        columns = 1 if self._track_id_freq else self._write_runtime_meta_dim
        if columns > 0:
            self._hash_zch_runtime_meta = torch.nn.Parameter(
                torch.zeros((self._zch_size, columns), dtype=torch.int64, device=self._device),
                requires_grad=False,
            )
        self.register_buffer(
            self.BUCKET_BUFFER, torch.tensor([[total_num_buckets]]), persistent=persist_bucket
        )

    def _create_scalar_logger(self) -> ScalarLogger:
        assert self._name is not None
        return ScalarLogger(
            name=self._name,
            zch_size=self._zch_size,
            frequency=self._tb_logging_frequency,
            start_bucket=self._start_bucket,
            num_buckets_per_rank=self._end_bucket - self._start_bucket,
            num_reserved_slots_per_bucket=self.get_reserved_slots_per_bucket(),
            device=self._device,
            disable_fallback=self._disable_fallback,
        )

    @property
    def device(self) -> torch.device:
        return _get_device(self._hash_zch_identities)

    @property
    def max_probe(self) -> int:
        return self._max_probe

    @property
    def disable_fallback(self) -> bool:
        return self._disable_fallback

    @property
    def eviction_flag(self) -> int:
        return get_kernel_from_policy(self._eviction_policy_name)

    def buckets(self) -> int:
        return self._buckets

    @property
    def is_sharded(self) -> bool:
        """True when this module holds only some of the table's buckets."""
        return (self._end_bucket - self._start_bucket) < self._buckets

    def validate_state(self) -> None:
        raise NotImplementedError("HashZchManagedCollisionModule keeps no shard segments to validate")

    def _set_eval_mode_impl(self) -> None:
        self.eval()
        self._is_inference = True
        self._evicted_indices = []
        self._eviction_policy_name = None
        self._eviction_module = None

    @staticmethod
    def _reset_inference_mode_load_state_dict_pre_hook(
        module: "HashZchManagedCollisionModule", state_dict: dict, prefix: str, *args: object
    ) -> None:
        # An inference module has no metadata: drop the checkpoint's (saved by training).
        if module._is_inference:
            state_dict.pop(prefix + HashZchManagedCollisionModule.METADATA_BUFFER, None)

    def reset_inference_mode(self) -> None:
        """Read only from now on, without eviction metadata (a checkpoint's metadata is not loaded)."""
        self._set_eval_mode_impl()
        self._hash_zch_metadata = None
        self._register_load_state_dict_pre_hook(
            self._reset_inference_mode_load_state_dict_pre_hook, with_module=True
        )

    def reset_intrainer_bulk_eval_mode(self) -> None:
        """Read only, keeping the eviction metadata (evaluation inside a training job)."""
        self._set_eval_mode_impl()

    def reset_training_mode(self) -> None:
        self._is_inference = False
        self.train()
        self._eviction_policy_name = self._eviction_policy_name_copy
        self._eviction_module = self._new_eviction_module()

    def preprocess(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return features

    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        return features  # the kernel updates the table during remap

    def evict(self) -> Tensor | None:
        if len(self._evicted_indices) == 0:
            return None
        rows = torch.unique(torch.cat(self._evicted_indices))
        self._evicted_indices = []
        offset = self._output_global_offset_tensor
        return rows + offset if offset is not None else rows

    def get_reserved_slots_per_bucket(self) -> int:
        """Rows of each bucket reserved for ids not opted in (-1: no opt-in)."""
        if self._opt_in_prob == -1:
            return -1
        buckets_here = self._end_bucket - self._start_bucket
        return math.floor(self._zch_size * self._percent_reserved_slots / 100 / buckets_here)

    def forward(
        self, features: dict[str, JaggedTensor], mutate_miss_lengths: bool = True
    ) -> dict[str, JaggedTensor]:
        return self.remap(features, mutate_miss_lengths=mutate_miss_lengths)

    def output_size(self) -> int:
        return self._zch_size

    def input_size(self) -> int:
        return self._input_hash_size

    def open_slots(self) -> Tensor:
        return torch.tensor([0])

    def rebuild_with_output_id_range(
        self,
        output_id_range: tuple[int, int],
        output_segments: list[int] | None = None,
        device: torch.device | None = None,
    ) -> "HashZchManagedCollisionModule":
        """The module of the shard holding rows ``[start, end)``, which must be bucket boundaries.

        The table's own segments are kept (``output_segments`` is ignored, as in TorchRec): they were
        derived from the whole table, which a caller sharding it may not know.
        """
        start, end = output_id_range
        if start not in self._output_segments or end not in self._output_segments:
            raise RuntimeError(
                f"cannot shard HashZchManagedCollisionModule {self._name!r}: rows [{start}, {end}) do not "
                f"start and end on its bucket boundaries {self._output_segments}"
            )
        return self.__class__(
            zch_size=end - start,
            device=device or self.device,
            max_probe=self._max_probe,
            total_num_buckets=self._buckets,
            input_hash_size=self._input_hash_size,
            is_inference=self._is_inference,
            start_bucket=self._output_segments.index(start),
            end_bucket=self._output_segments.index(end),
            output_segments=self._output_segments,
            name=self._name,
            tb_logging_frequency=self._tb_logging_frequency,
            eviction_policy_name=self._eviction_policy_name,
            eviction_config=self._eviction_config,
            opt_in_prob=self._opt_in_prob,
            percent_reserved_slots=self._percent_reserved_slots,
            disable_fallback=self._disable_fallback,
            track_id_freq=self._track_id_freq,
            read_only_suffix=self._read_only_suffix,
            enable_per_feature_lookups=self._enable_per_feature_lookups,
            no_bag=self._no_bag,
            write_runtime_meta_dim=self._write_runtime_meta_dim,
            persist_hash_zch_bucket=self._persist_hash_zch_bucket,
        )

    def get_indices_of_reserved_slots_per_bucket(self) -> Tensor | None:
        """This shard's reserved rows: the last ``get_reserved_slots_per_bucket()`` of each of its buckets."""
        reserved = self.get_reserved_slots_per_bucket()
        if reserved == -1:
            return None
        sizes = self.input_mapper._zch_size_per_training_rank
        starts = self.input_mapper._train_rank_offsets
        ends = [int(starts[b] + sizes[b]) for b in range(self._start_bucket, self._end_bucket)]
        rows = torch.cat([torch.arange(end - reserved, end, device=self.device) for end in ends])
        if self._output_global_offset_tensor is not None:
            rows -= self._output_global_offset_tensor
        return rows
