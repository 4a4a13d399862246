"""``torchrec.distributed.train_pipeline`` at rectrain's path (the pipelines: ``rectrain.train.pipeline``)."""

from rectrain.train.pipeline import TrainPipeline, TrainPipelineBase, TrainPipelineSparseDist

__all__ = ["TrainPipeline", "TrainPipelineBase", "TrainPipelineSparseDist"]
