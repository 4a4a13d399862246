"""``torchrec.modules.hash_mc_modules`` at rectrain's path (implemented in ``rectrain.zch``)."""

from rectrain.zch.hash_zch import HashZchManagedCollisionModule
from rectrain.zch.input_mapper import TrainInputMapper, _compute_lengths_from_hits

__all__ = ["HashZchManagedCollisionModule", "TrainInputMapper", "_compute_lengths_from_hits"]
