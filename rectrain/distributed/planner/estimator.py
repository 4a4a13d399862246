"""``torchrec.distributed.planner.estimator`` at rectrain's path: its names are refused by name
(``rectrain.planner.refusals``)."""

from rectrain.planner.refusals import refused_class

EmbeddingPerfEstimatorFactory = refused_class(__name__, "EmbeddingPerfEstimatorFactory")
