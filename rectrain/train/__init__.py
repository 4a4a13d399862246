"""Training jobs: config, preflight checks, the loop and its pipelines, checkpoints, evaluation, metrics log.

``rectrain train`` runs a ``job.TrainJob``; its pipelines (TorchRec's ``TrainPipelineSparseDist``) overlap
data movement and communication with compute.
"""

from rectrain.train.pipeline import TrainPipelineBase, TrainPipelineSparseDist

__all__ = ["TrainPipelineBase", "TrainPipelineSparseDist"]
