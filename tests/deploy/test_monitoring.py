"""Alert rules and dashboards use only metrics and labels the server declares (read from
``recserve.server.operations.metrics``), and the scrape configs point at the port the server serves /metrics
on."""

from __future__ import annotations

import re

import pytest

from tests.deploy import promql
from tests.deploy.dockerfile import exec_form
from tests.deploy.manifests import DEPLOY, load_json, load_yaml, read_command

# Labels Prometheus attaches to every scraped sample (target labels, incl. those relabelled in k8s).
TARGET_LABELS = {"job", "instance", "pod", "namespace"}
# Series Prometheus makes itself rather than scraping them.
SYNTHETIC = {"up": set()}
PROMETHEUS = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "recserve.json"


def check_query(expr: str, declared: dict[str, set[str]], where: str) -> set[str]:
    """Asserts every metric and label of ``expr`` is declared; returns the metric names."""
    query = promql.parse(expr)
    assert query.selectors, f"{where}: no metric in {expr!r}"
    known = {**declared, **SYNTHETIC}
    labels_in_scope = set(TARGET_LABELS)
    for selector in query.selectors:
        assert selector.metric in known, (
            f"{where}: metric {selector.metric!r} is not declared in recserve/server/operations/metrics.py "
            f"(declared: {sorted(n for n in declared if not n.endswith('_created'))})"
        )
        allowed = known[selector.metric] | TARGET_LABELS
        for label in selector.labels:
            assert label in allowed, (
                f"{where}: {selector.metric} has no label {label!r} (has {sorted(allowed)})"
            )
        labels_in_scope |= allowed
    for label in query.grouping:
        assert label in labels_in_scope, f"{where}: groups by {label!r}, which no selected metric has"
    return {s.metric for s in query.selectors}


def alert_rules() -> list[dict]:
    (doc,) = load_yaml(PROMETHEUS / "alerts.yml")
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alert_rules_cover_latency_errors_and_queue_with_declared_metrics(declared_metrics):
    used = set()
    for rule in alert_rules():
        assert {"alert", "expr", "labels", "annotations"} <= rule.keys(), rule
        assert rule["labels"]["severity"] in ("warning", "critical")
        used |= check_query(rule["expr"], declared_metrics, f"alert {rule['alert']}")
    assert "recserve_request_latency_seconds_bucket" in used
    assert "recserve_requests_total" in used and "recserve_queue_depth" in used


def test_latency_alert_threshold_is_a_histogram_bucket_boundary():
    from recserve.server.operations.metrics import LATENCY_BUCKETS

    (rule,) = [r for r in alert_rules() if r["alert"] == "RecserveHighP99Latency"]
    threshold = float(re.search(r">\s*([0-9.]+)\s*$", rule["expr"].strip()).group(1))
    assert threshold in LATENCY_BUCKETS, "p99 from a histogram is exact only at a bucket boundary"


def _dashboard_queries() -> list[tuple[str, str]]:
    dashboard = load_json(DASHBOARD)
    return [
        (f"panel {panel['title']!r}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_dashboard_panels_query_declared_metrics(declared_metrics):
    queries = _dashboard_queries()
    assert len(queries) >= 10
    used = set()
    for where, expr in queries:
        used |= check_query(expr, declared_metrics, where)
    expected = {"recserve_requests_total", "recserve_request_latency_seconds_bucket", "recserve_queue_depth"}
    expected |= {"recserve_queue_wait_seconds_bucket", "recserve_inference_seconds_bucket"}
    expected |= {"recserve_batch_size_bucket", "recserve_model_info", "recserve_model_reloads_total"}
    assert expected <= used, f"dashboard lacks {sorted(expected - used)}"


def test_dashboard_variables_and_datasource_match_the_provisioning(declared_metrics):
    dashboard = load_json(DASHBOARD)
    for variable in dashboard["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"])
        assert match, variable["definition"]
        metric, label = match.groups()
        assert metric in declared_metrics and label in declared_metrics[metric] | TARGET_LABELS
    (provisioned,) = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yaml")
    uids = {d["uid"] for d in provisioned["datasources"]}
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] in uids, panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-k8s.yml"])
def test_prometheus_configs_load_existing_rule_files(config: str):
    (doc,) = load_yaml(PROMETHEUS / config)
    for rule_file in doc["rule_files"]:
        assert (PROMETHEUS / rule_file).is_file(), f"{config}: rule file {rule_file} does not exist"
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "recserve" and job["metrics_path"] == "/metrics"


def compose_volume(spec: str) -> tuple[str, str]:
    """(source, target) of a short-syntax volume, ``${VAR:-default}`` taken at its default."""
    source, target = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", spec).split(":")[:2]
    return source, target


def _compose() -> dict:
    (doc,) = load_yaml(DEPLOY / "compose.yaml")
    return doc


def test_compose_prometheus_scrapes_the_servers_metrics_port(dockerfile):
    compose = _compose()
    server = compose["services"]["recserve"]
    entrypoint = dockerfile.inherited(server["build"]["target"], "ENTRYPOINT")
    args = read_command([*exec_form(entrypoint, "ENTRYPOINT"), *server["command"]], "compose recserve").args
    (doc,) = load_yaml(PROMETHEUS / "prometheus.yml")
    (static,) = doc["scrape_configs"][0]["static_configs"]
    assert static["targets"] == [f"recserve:{args.metrics_port}"]
    published = {int(p.rsplit(":", 1)[1]) for p in server["ports"]}
    assert published == {args.port, args.metrics_port, args.http_port}
    assert args.package is None and args.metrics_host == "0.0.0.0"
    mounted = {compose_volume(v)[1] for v in server["volumes"]}
    assert any(str(args.watch).startswith(m) for m in mounted), (args.watch, mounted)


def test_compose_mounts_existing_config_and_grafana_reaches_prometheus():
    compose = _compose()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source, _ = compose_volume(volume)
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"compose {name}: {source} does not exist"
    (provisioned,) = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yaml")
    (url,) = [d["url"] for d in provisioned["datasources"]]
    prometheus_port = compose["services"]["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert url == f"http://prometheus:{prometheus_port}"
    dashboards = compose["services"]["grafana"]["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in dashboards
    (provider,) = load_yaml(DEPLOY / "grafana/provisioning/dashboards/recserve.yaml")
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
