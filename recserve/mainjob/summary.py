"""The main job's results: read back from its artefacts and outputs, and printed as one summary."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from recserve.mainjob.config import MainJobError

_LOADGEN = re.compile(
    r"(?P<eps>[\d,.]+) examples/s .*?p50 (?P<p50>[\d.]+) .*?p99 (?P<p99>[\d.]+) .*?errors: (?P<errors>.*)$"
)


@dataclass
class TablePlacement:
    """Where one table was trained: its sharding type and the ranks holding its shards."""

    table: str
    sharding_type: str
    ranks: list[int]


@dataclass
class MainJobSummary:
    """Everything the main job measured; written to ``OUT/summary.json`` and printed by ``format_summary``."""

    out: str
    eval_auc: float
    eval_ne: float
    eval_log_loss: float
    train_steps: int
    plan: list[TablePlacement]
    checkpoint_dir: str
    checkpoint_mb: float
    package_dir: str
    package_mb: float
    served_rows: int
    served_auc: float
    served_max_abs_diff: float
    throughput_examples_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    loadgen_errors: str
    metrics_url: str
    server_exit_code: int | None = None
    serving_device: str = "cpu"  # where the package was placed and served
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def dir_mb(path: Path) -> float:
    """Total size of the files under ``path`` in MB (10^6 bytes)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def last_eval(metrics_log: Path) -> dict:
    """The last ``"event": "eval"`` record of the training job's JSONL metrics log."""
    if not metrics_log.exists():
        raise MainJobError(f"stage 'train': {metrics_log} was not written")
    records = [json.loads(line) for line in metrics_log.read_text().splitlines() if line.strip()]
    evals = [r for r in records if r.get("event") == "eval"]
    if not evals:
        raise MainJobError(f"stage 'train': {metrics_log} holds no eval record ({len(records)} records)")
    return evals[-1]


def plan_of(step_dir: Path) -> list[TablePlacement]:
    """Per-table sharding type and ranks from the checkpoint manifest's sharding plan."""
    manifest = json.loads((step_dir / "manifest.json").read_text())
    placements = []
    for module in manifest["plan"]["modules"].values():
        for table, entry in module.items():
            placements.append(TablePlacement(table, entry["sharding_type"], sorted(entry["ranks"])))
    return placements


def parse_loadgen(output: str) -> tuple[float, float, float, str]:
    """``(examples/s, p50 ms, p99 ms, errors)`` from ``recserve loadgen``'s summary line."""
    for line in reversed(output.splitlines()):
        match = _LOADGEN.search(line)
        if match:
            eps = float(match["eps"].replace(",", ""))
            return eps, float(match["p50"]), float(match["p99"]), match["errors"].strip()
    raise MainJobError(f"stage 'loadgen': no summary line in its output:\n{output[-2000:]}")


def format_plan(plan: list[TablePlacement]) -> str:
    """Tables grouped by (sharding type, ranks): ``table_wise on rank 0: t_cat_0, t_cat_2, ...``."""
    groups: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for p in sorted(plan, key=lambda p: _natural(p.table)):
        groups.setdefault((p.sharding_type, tuple(p.ranks)), []).append(p.table)
    lines = []
    for (kind, ranks), tables in sorted(groups.items()):
        where = "rank" if len(ranks) == 1 else "ranks"
        lines.append(
            f"    {kind} on {where} {','.join(map(str, ranks))}: {len(tables)} tables ({', '.join(tables)})"
        )
    return "\n".join(lines)


def _natural(name: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def format_summary(s: MainJobSummary) -> str:
    """The human-readable summary printed at the end of the main job."""
    total = sum(s.stage_seconds.values())
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in s.stage_seconds.items())
    return "\n".join(
        [
            "== main job summary ==",
            f"eval (held-out, step {s.train_steps}): AUC {s.eval_auc:.4f}  NE {s.eval_ne:.4f}  "
            f"log loss {s.eval_log_loss:.4f}",
            f"plan ({len(s.plan)} tables):",
            format_plan(s.plan),
            f"checkpoint: {s.checkpoint_dir} ({s.checkpoint_mb:.2f} MB)",
            f"package (int8, on {s.serving_device}): {s.package_dir} ({s.package_mb:.2f} MB)",
            f"served {s.served_rows} held-out rows: AUC {s.served_auc:.4f}, "
            f"max |server - in-process Predictor| = {s.served_max_abs_diff:.2e}",
            f"load test: {s.throughput_examples_per_s:,.0f} examples/s, "
            f"latency p50 {s.latency_p50_ms:.2f} ms, p99 {s.latency_p99_ms:.2f} ms, "
            f"errors: {s.loadgen_errors}",
            f"metrics: {s.metrics_url} (scraped to metrics.prom; the server is stopped after this summary)",
            f"time: {total:.1f} s ({stages})",
            f"output: {s.out}",
        ]
    )


@dataclass
class OnlineSummary:
    """What the online mode measured; written to ``OUT/summary.json`` and printed by
    ``format_online_summary``. Scores are the probe's served means (planted-id rows vs the same rows with
    control ids), "before" at the last probe before the change file arrived, "after" at the last probe."""

    out: str
    files: int
    rows_per_file: int
    change_at_file: int
    train_steps: int
    progressive_auc: float
    progressive_ne: float
    bases: int
    deltas_published: int
    deltas_applied: int
    deltas_refused: int
    final_version: str
    freshness_samples: int
    freshness_p50_s: float
    freshness_p99_s: float
    deltas_before_serving: int  # published while the server was starting: not freshness samples
    planted_before: float
    control_before: float
    version_before: str
    planted_after: float
    control_after: float
    version_after: str
    score_rise: float  # (planted - control) after minus before
    reaction_s: float  # change file arrival -> first probe with half the rise
    probes: int
    requests_ok: int
    requests_failed: int
    failures: dict[str, int]
    latency_p50_ms: float
    latency_p99_ms: float
    metrics_url: str
    serving_device: str = "cpu"
    server_exit_code: int | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def last_event(metrics_log: Path, event: str) -> dict:
    """The last record of ``event`` in the training job's JSONL metrics log (``{}`` when none)."""
    if not metrics_log.exists():
        raise MainJobError(f"stage 'train': {metrics_log} was not written")
    records = [json.loads(line) for line in metrics_log.read_text().splitlines() if line.strip()]
    return next((r for r in reversed(records) if r.get("event") == event), {})


def metric_total(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (all label sets) on a Prometheus text page."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def online_failures(s: OnlineSummary, min_rise: float) -> list[str]:
    """What makes an online run fail: any failed request, or a planted score that did not rise."""
    problems = []
    if s.requests_failed:
        failures = ", ".join(f"{k} {v}" for k, v in sorted(s.failures.items()))
        problems.append(f"{s.requests_failed} requests failed ({failures})")
    if not s.score_rise >= min_rise:  # nan fails too
        problems.append(
            f"the planted ids' score minus the controls' rose by {s.score_rise:+.4f}, less than "
            f"min_rise {min_rise}"
        )
    return problems


def format_online_summary(s: OnlineSummary) -> str:
    """The human-readable summary printed at the end of the online mode."""
    total = sum(s.stage_seconds.values())
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in s.stage_seconds.items())
    failures = ", ".join(f"{k} {v}" for k, v in sorted(s.failures.items())) or "none"
    return "\n".join(
        [
            "== main job summary (online) ==",
            f"stream: {s.files} files x {s.rows_per_file:,} rows, planted change from file "
            f"{s.change_at_file}",
            f"training: {s.train_steps} steps, progressive AUC {s.progressive_auc:.4f}  "
            f"NE {s.progressive_ne:.4f}",
            f"published: {s.bases} bases, {s.deltas_published} deltas; server applied {s.deltas_applied}, "
            f"refused {s.deltas_refused}; final version {s.final_version}",
            f"freshness (delta wall_time -> first reply at that version): p50 {s.freshness_p50_s:.2f} s, "
            f"p99 {s.freshness_p99_s:.2f} s over {s.freshness_samples} deltas "
            f"({s.deltas_before_serving} published before the server served, not counted)",
            f"served mean score before the change (version {s.version_before}): planted ids "
            f"{s.planted_before:.4f}, controls {s.control_before:.4f}",
            f"served mean score after the change (version {s.version_after}): planted ids "
            f"{s.planted_after:.4f}, controls {s.control_after:.4f}",
            f"planted - control rose by {s.score_rise:+.4f}; half of it served {s.reaction_s:.1f} s after "
            f"the change file arrived ({s.probes} probes)",
            f"requests: {s.requests_ok:,} ok, {s.requests_failed} failed ({failures}); load latency "
            f"p50 {s.latency_p50_ms:.2f} ms, p99 {s.latency_p99_ms:.2f} ms",
            f"metrics: {s.metrics_url} (scraped to metrics.prom; the server is stopped after this summary)",
            f"time: {total:.1f} s ({stages})",
            f"output: {s.out}",
        ]
    )
