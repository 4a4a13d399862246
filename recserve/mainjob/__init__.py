"""The main job: the whole path from synthetic data to a served, load-tested model in one command.

``run_main_job(MainJobConfig(out=...))`` (or ``recserve main`` / ``./run.sh``) writes synthetic Criteo data,
trains DLRM on local ranks with torchrun, verifies the checkpoint, exports an int8 package, serves it over
gRPC, checks served scores against the in-process Predictor, load-tests it, scrapes /metrics and prints a
summary; every artefact lands under one output directory.
"""

from recserve.mainjob.config import MainJobConfig, MainJobError
from recserve.mainjob.job import run_main_job
from recserve.mainjob.summary import MainJobSummary

__all__ = ["MainJobConfig", "MainJobError", "MainJobSummary", "run_main_job"]
