"""The training loop's parts: pipelines that overlap data movement and communication with compute."""

from rectrain.train.pipeline import TrainPipelineBase, TrainPipelineSparseDist

__all__ = ["TrainPipelineBase", "TrainPipelineSparseDist"]
