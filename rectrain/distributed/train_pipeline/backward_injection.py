"""``torchrec.distributed.train_pipeline.backward_injection`` at rectrain's path (in ``rectrain.train``)."""

from rectrain.train.backward_injection import (
    FirstGradTensorFinder,
    GradTensorFinder,
    InjectionSite,
    InjectionTargetType,
    OutputDistTensorFinder,
    _position_to_index,
    register_backward_hook,
    will_hook_fire,
)

__all__ = [
    "FirstGradTensorFinder",
    "GradTensorFinder",
    "InjectionSite",
    "InjectionTargetType",
    "OutputDistTensorFinder",
    "_position_to_index",
    "register_backward_hook",
    "will_hook_fire",
]
