"""The main job's entry point: the offline path (``job``) or the online mode (``online``), by ``cfg.online``.

Both modes share the stages (``stages``), the output dir and the summary style; ``online`` builds on ``job``'s
helpers, so the choice between them lives here rather than in either.
"""

from __future__ import annotations

from recserve.mainjob.config import MainJobConfig
from recserve.mainjob.job import run_offline_job
from recserve.mainjob.online import run_online_job
from recserve.mainjob.stages import Echo
from recserve.mainjob.summary import MainJobSummary, OnlineSummary


def run_main_job(cfg: MainJobConfig, echo: Echo = print) -> MainJobSummary | OnlineSummary:
    """Run the main job (``cfg.online``: its online mode); return the summary, also ``OUT/summary.json``.
    Raises ``MainJobError`` naming the stage that failed."""
    if cfg.online:
        return run_online_job(cfg, echo)
    return run_offline_job(cfg, echo)
