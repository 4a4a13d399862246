"""The main job: the whole path from synthetic data to a served, load-tested model in one command.

``run_main_job(MainJobConfig(out=...))`` (or ``recserve main`` / ``./run.sh``) writes synthetic Criteo data,
trains DLRM on local ranks with torchrun, verifies the checkpoint, exports an int8 package, serves it over
gRPC, checks served scores against the in-process Predictor, load-tests it, scrapes /metrics and prints a
summary; every artefact lands under one output directory. ``MainJobConfig(online=True)`` (``./run.sh
--online``) runs the online mode instead: arriving files, training that follows them and publishes, a server
that follows the publish dir, and a probe that shows a planted change being served (``online``).
"""

from recserve.mainjob.config import MainJobConfig, MainJobError
from recserve.mainjob.modes import run_main_job
from recserve.mainjob.summary import MainJobSummary, OnlineSummary

__all__ = ["MainJobConfig", "MainJobError", "MainJobSummary", "OnlineSummary", "run_main_job"]
