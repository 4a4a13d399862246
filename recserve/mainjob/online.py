"""The main job's online mode (``./run.sh --online``): a model that follows its data, served seconds behind.

Stage order: data (run.toml, the probe's rows), train (2-rank ``rectrain train`` follows the empty
``OUT/stream`` and publishes base 1 to ``OUT/publish``, then a delta every ``publish_every_s`` once it
trains), serve (``recserve serve --follow OUT/publish``), stream (Criteo files arrive in ``OUT/stream``, the
planted change among them, while a closed-loop load and the probe call the server; the trainer ends at the
step that trains the last file and writes a final delta; the job waits until the server replies at that
version), scrape, then the summary is printed and the server stopped (exit 0). The job fails
(``MainJobError``, after the summary) when a request failed or the planted score did not rise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack

from recserve.mainjob.config import JobPaths, MainJobConfig, MainJobError, run_config_text
from recserve.mainjob.job import criteo_batch, prepare_out, scrape, serving_device, train_command
from recserve.mainjob.measure import PublishWatch, freshness_s, percentile, planted_rise
from recserve.mainjob.stages import BackgroundStage, Echo, ServerProcess, StageTimer, cli, free_port
from recserve.mainjob.stream import StreamWriter, write_probe_file
from recserve.mainjob.summary import (
    OnlineSummary,
    format_online_summary,
    last_event,
    metric_total,
    online_failures,
)
from recserve.mainjob.traffic import ClosedLoop, Probe, VersionLog, version_key
from rectrain.models.batch import Batch


class _Run:
    """The parts of one online run and what they share: the versions seen, the publish dir's contents."""

    def __init__(self, cfg: MainJobConfig, paths: JobPaths, probe_batch: Batch) -> None:
        self.cfg = cfg
        self.paths = paths
        port, metrics_port = free_port(), free_port()
        self.target = f"127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.versions = VersionLog()
        self.watch = PublishWatch(paths.publish)
        self.probe = Probe(self.target, self.versions, probe_batch, cfg.probe_interval_s)
        # The change file waits for the probe's first score, so that there is a "before".
        gate_s = cfg.server_start_timeout_s
        self.writer = StreamWriter(cfg, paths.stream, self.probe.scored, gate_timeout_s=gate_s)
        self.trainer = BackgroundStage("train", train_command(cfg, paths), paths.logs)
        # One serving worker: the machine this runs on by default has 2 cores, and the trainer has 2 ranks.
        # No queue-lag shedding: it refuses new calls while gRPC's queue waits over 100 ms, which protects a
        # server from its own callers, but here a few closed-loop callers cannot build a queue, and the lag
        # comes from the trainer's ranks and a new base's load taking the shared cores (a tiny run once had
        # 18 calls refused RESOURCE_EXHAUSTED during a base swap on a box at load 12).
        serve = [*cli("recserve"), "serve", "--follow", str(paths.publish), "--port", str(port)]
        serve += ["--metrics-port", str(metrics_port), "--admin-port", "-1", "--workers", "1"]
        serve += ["--max-queue-lag-ms", "0"]
        serve += ["--device", serving_device(cfg)]
        self.server = ServerProcess(serve, self.target, paths.logs / "serve.log", cfg.server_start_timeout_s)
        self.load: ClosedLoop | None = None
        self.metrics_text = ""


def run_online_job(cfg: MainJobConfig, echo: Echo = print) -> OnlineSummary:
    """Run every stage in order; return the summary (also ``OUT/summary.json``). Raises ``MainJobError``."""
    paths = prepare_out(cfg.out)
    timer = StageTimer(echo)
    with timer.stage("data", f"run.toml following {paths.stream}, {2 * cfg.probe_rows} probe rows"):
        paths.data.mkdir(parents=True, exist_ok=True)
        paths.stream.mkdir()  # empty until the stream stage: the trainer waits in it
        paths.run_config.write_text(run_config_text(cfg, paths))
        probe_file = write_probe_file(cfg, paths.data / "probe.tsv")
        run = _Run(cfg, paths, criteo_batch(paths.run_config, probe_file, 2 * cfg.probe_rows, "data"))
    with ExitStack() as running:  # on any error or Ctrl-C: load, probe, writer, server, trainer stop
        _start(run, timer, running)
        what = f"{cfg.files} files every {cfg.file_interval_s:g} s, the change from file {cfg.change_at_file}"
        with timer.stage("stream", f"{what}; load and probe on the server"):
            run.load = ClosedLoop(
                run.target, run.versions, cfg.loadgen_concurrency, cfg.loadgen_batch, cfg.seed
            )
            with run.writer, run.load, run.probe:
                _follow_to_the_end(run)
        with timer.stage("scrape", run.metrics_url):
            run.metrics_text = scrape(run.metrics_url, paths.scrape)
        summary = _summary(run)
        summary.stage_seconds = timer.seconds
        echo("")
        echo(format_online_summary(summary))
    summary.server_exit_code = run.server.exit_code
    paths.summary.write_text(summary.to_json())
    paths.probe_log.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in run.probe.records))
    _check(summary, cfg, run.server)
    echo(f"server stopped (SIGTERM, exit 0); artefacts in {paths.out}")
    return summary


def _start(run: _Run, timer: StageTimer, running: ExitStack) -> None:
    """Stages train (until the first base is published) and serve (until SERVING); no file has arrived
    yet, so the trainer waits while the server starts instead of competing with it for the CPUs."""
    cfg, paths = run.cfg, run.paths
    publishing = f"publishing every {cfg.publish_every_s:g} s to {paths.publish}"
    with timer.stage("train", f"{cfg.nproc} ranks follow {paths.stream}, {publishing}; first base"):
        running.enter_context(run.watch)
        running.enter_context(run.trainer)
        _wait_until(lambda: run.watch.bases, "published base", cfg.server_start_timeout_s, run.trainer)
    with timer.stage("serve", f"recserve serve --follow on {run.target}, metrics on {run.metrics_url}"):
        running.enter_context(run.server)  # stopped with SIGTERM when the job's block exits


def _follow_to_the_end(run: _Run) -> None:
    """Every file arrives, the trainer trains them all and exits 0, the server replies at its last delta."""
    cfg = run.cfg
    run.writer.join(cfg.files * cfg.file_interval_s + cfg.server_start_timeout_s + 120)
    run.trainer.wait(timeout_s=300)
    run.watch.scan()
    final = run.watch.newest_version()

    def served_final() -> bool:
        newest = run.versions.newest()
        return newest is not None and version_key(newest) >= version_key(final)

    _wait_until(served_final, f"reply from the final version {final}", 120, run.server)


def _wait_until(
    condition: Callable[[], object], what: str, timeout_s: float, process: BackgroundStage | ServerProcess
) -> None:
    """Poll ``condition`` until true, raising if ``process`` (which makes it true) exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        process.check_running()
        if time.monotonic() > deadline:
            raise MainJobError(f"main job (online): no {what} after {timeout_s:.0f} s; see {process.log}")
        time.sleep(0.1)


def _summary(run: _Run) -> OnlineSummary:
    cfg, paths, probe, load = run.cfg, run.paths, run.probe, run.load
    freshness, before_serving = freshness_s(run.watch.deltas, run.versions.first_seen)
    rise = planted_rise(probe.records, run.writer.change_time or float("inf"))
    if rise is None:
        raise MainJobError(
            f"main job (online): the probe has no score on both sides of the change ({len(probe.records)} "
            f"probes); see {paths.logs / 'serve.log'}"
        )
    trained, progressive = (
        last_event(paths.metrics_log, "train"),
        last_event(paths.metrics_log, "progressive"),
    )
    failures = load.failures + probe.failures
    return OnlineSummary(
        out=str(paths.out),
        files=cfg.files,
        rows_per_file=cfg.rows_per_file,
        change_at_file=cfg.change_at_file,
        train_steps=int(trained.get("step", 0)),
        progressive_auc=float(progressive.get("auc", float("nan"))),
        progressive_ne=float(progressive.get("ne", float("nan"))),
        bases=len(run.watch.bases),
        deltas_published=len(run.watch.deltas),
        deltas_applied=int(metric_total(run.metrics_text, "recserve_model_deltas_applied_total")),
        deltas_refused=int(metric_total(run.metrics_text, "recserve_model_deltas_refused_total")),
        final_version=run.versions.newest() or "",
        freshness_samples=len(freshness),
        freshness_p50_s=percentile(freshness, 50),
        freshness_p99_s=percentile(freshness, 99),
        deltas_before_serving=before_serving,
        planted_before=rise.before.planted,
        control_before=rise.before.control,
        version_before=rise.before.version,
        planted_after=rise.after.planted,
        control_after=rise.after.control,
        version_after=rise.after.version,
        score_rise=rise.rise,
        reaction_s=rise.reaction_s,
        probes=len(probe.records),
        requests_ok=len(load.latencies_s) + len(probe.records),
        requests_failed=sum(failures.values()),
        failures=dict(failures),
        latency_p50_ms=load.percentile_ms(50),
        latency_p99_ms=load.percentile_ms(99),
        metrics_url=run.metrics_url,
        serving_device=serving_device(cfg),
    )


def _check(summary: OnlineSummary, cfg: MainJobConfig, server: ServerProcess) -> None:
    """The online mode's pass conditions, checked after the summary is printed and written."""
    problems = online_failures(summary, cfg.min_rise)
    if server.exit_code != 0:
        problems.append(
            f"the server exited with {server.exit_code} after SIGTERM (expected 0); see {server.log}"
        )
    if problems:
        where = cfg.out / "summary.json"
        raise MainJobError(f"main job (online) failed: {'; '.join(problems)}; summary in {where}")
