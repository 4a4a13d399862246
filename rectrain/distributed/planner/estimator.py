"""``torchrec.distributed.planner.estimator`` at rectrain's path: its names are refused by name
(``rectrain.planner.refusals``)."""

from rectrain.planner.refusals import refusing_getattr

__getattr__ = refusing_getattr(__name__)
