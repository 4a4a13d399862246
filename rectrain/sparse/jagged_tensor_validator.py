"""TorchRec's KJT validator (``torchrec.sparse.jagged_tensor_validator``), on rectrain's checks.

``validate_keyed_jagged_tensor(kjt, configs=None)`` raises ValueError for malformed lengths/offsets, keys
or weights, and returns whether every id lies inside its table (``configs``); as in TorchRec, problems
with a variable batch per key only log a warning. ``kjt.validate()`` is the strict check (VBE included).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rectrain.sparse import validation
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor

logger = logging.getLogger(__name__)


def validate_keyed_jagged_tensor(kjt: KeyedJaggedTensor, configs: Sequence | None = None) -> bool:
    """ValueError naming the problem unless lengths/offsets, keys and weights are consistent; then True,
    or, given ``configs`` (tables: ``feature_names``, ``num_embeddings``), whether all ids are in range."""
    _validate_lengths_and_offsets(kjt)
    _validate_keys(kjt)
    _validate_weights(kjt)
    if configs is not None:
        return _validate_feature_range(kjt, configs)
    return True


def _validate_lengths_and_offsets(kjt: KeyedJaggedTensor) -> bool:
    validation.check_jagged(kjt.values(), kjt.lengths_or_none(), kjt.offsets_or_none(), "KeyedJaggedTensor")
    return True


def _validate_keys(kjt: KeyedJaggedTensor) -> bool:
    keys = kjt.keys()
    validation.check_keys_unique(keys)
    lengths, offsets = kjt.lengths_or_none(), kjt.offsets_or_none()
    num_rows = lengths.numel() if lengths is not None else offsets.numel() - 1
    if keys and kjt.variable_stride_per_key():
        _validate_vbe_properties(kjt, num_rows)
    else:
        validation.check_num_rows(num_rows, len(keys), None, None)
    return True


def _validate_weights(kjt: KeyedJaggedTensor) -> bool:
    validation.check_weights(kjt.values(), kjt.weights_or_none())
    return True


def _validate_vbe_properties(kjt: KeyedJaggedTensor, num_rows: int) -> bool:
    """Warn (and return False) unless a user-built VBE KJT has [keys, 1] strides summing to its rows."""
    per_rank = kjt._stride_per_key_per_rank
    num_keys = len(kjt.keys())
    if per_rank is None:
        problem = "stride_per_key_per_rank cannot be None for VBE KeyedJaggedTensor"
    elif per_rank.dim() != 2:
        problem = f"stride_per_key_per_rank must be 2-dimensional, but got {per_rank.dim()} dimensions"
    elif per_rank.size(0) != num_keys:
        problem = (
            f"stride_per_key_per_rank first dimension must equal num_features ({num_keys}), "
            f"but got {per_rank.size(0)}"
        )
    elif per_rank.size(1) != 1:
        problem = (
            f"stride_per_key_per_rank second dimension must be 1 for user-input KJT (prior to input_dist), "
            f"but got {per_rank.size(1)}"
        )
    elif int(per_rank.sum()) != num_rows:
        problem = (
            f"Sum of stride_per_key_per_rank ({int(per_rank.sum())}) must equal the number of lengths "
            f"({num_rows}) for VBE KeyedJaggedTensor"
        )
    else:
        return True
    logger.warning(problem)
    return False


def _validate_feature_range(kjt: KeyedJaggedTensor, configs: Sequence) -> bool:
    """Whether every id of a feature some table reads lies in [0, num_embeddings); warns per feature."""
    rows = {feature: config.num_embeddings for config in configs for feature in config.feature_names}
    if not set(kjt.keys()) & set(rows):
        logger.info("none of the KJT's keys %s is read by the tables %s", kjt.keys(), list(rows))
        return True
    if kjt.lengths().numel() == 0:
        return True
    valid = True
    for feature, jt in kjt.to_dict().items():
        ids = jt.values()
        if feature not in rows or ids.numel() == 0:
            continue
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= rows[feature]:
            logger.warning(
                "Feature %s has range (%d, %d) which is out of range (0, %d)",
                feature,
                low,
                high,
                rows[feature],
            )
            valid = False
    return valid
