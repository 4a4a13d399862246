"""Helpers of ``torchrec.modules.utils`` that TorchRec users call on their models."""

from torch import nn

_BUCKET_BUFFER = "_hash_zch_bucket"  # HashZchManagedCollisionModule.BUCKET_BUFFER


def make_hash_zch_buckets_non_persistent(module: nn.Module) -> int:
    """Leave the bucket count of every ``HashZchManagedCollisionModule`` under ``module`` out of
    ``state_dict`` (it follows from the config), so checkpoints written before it existed still load.

    Returns how many modules changed.
    """
    changed = 0
    for submodule in module.modules():
        if (
            _BUCKET_BUFFER in submodule._buffers
            and _BUCKET_BUFFER not in submodule._non_persistent_buffers_set
        ):
            submodule._non_persistent_buffers_set.add(_BUCKET_BUFFER)
            changed += 1
    return changed
