"""``torchrec.distributed.train_pipeline.train_pipelines`` at rectrain's path."""

from rectrain.train.pipeline import TrainPipeline, TrainPipelineBase, TrainPipelineSparseDist

__all__ = ["TrainPipeline", "TrainPipelineBase", "TrainPipelineSparseDist"]
