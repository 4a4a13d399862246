"""The checkers behind the deploy/ tests catch drift: unknown flags, abbreviations, undefined variables,
undeclared metrics and labels, .dockerignore and Dockerfile semantics."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.deploy import promql
from tests.deploy.dockerfile import DockerIgnore, read_dockerfile
from tests.deploy.manifests import container_argv, read_command
from tests.deploy.test_monitoring import check_query

_names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda s: (
        s not in {"by", "without", "on", "ignoring", "bool", "and", "or", "unless", "offset", "inf", "nan"}
    )
)
_values = st.text(st.characters(codec="ascii", exclude_characters='"\\\n'), max_size=10)


@given(
    metric=_names.map(lambda s: f"recserve_{s}"),
    labels=st.dictionaries(_names, _values, max_size=3),
    grouping=st.lists(_names, max_size=3, unique=True),
    quantile=st.floats(0, 1),
)
def test_promql_reader_finds_selectors_labels_and_grouping(metric, labels, grouping, quantile):
    matchers = ", ".join(f'{k}=~"{v}"' for k, v in labels.items())
    expr = (
        f"histogram_quantile({quantile}, sum by ({', '.join(grouping)}) "
        f"(rate({metric}{{{matchers}}}[$__rate_interval]))) > 0.025 and on () vector(1)"
    )
    query = promql.parse(expr)
    assert [(s.metric, s.labels) for s in query.selectors] == [(metric, labels)]
    assert query.grouping == set(grouping)


def test_undeclared_metric_or_label_fails(declared_metrics):
    check_query('sum by (code) (rate(recserve_requests_total{code!="OK"}[5m]))', declared_metrics, "ok")
    with pytest.raises(AssertionError, match="recserve_request_total"):
        check_query("rate(recserve_request_total[5m])", declared_metrics, "typo")
    with pytest.raises(AssertionError, match="no label 'status'"):
        check_query('rate(recserve_requests_total{status="OK"}[5m])', declared_metrics, "label")
    with pytest.raises(AssertionError, match="groups by 'le'"):
        check_query("sum by (le) (rate(recserve_requests_total[5m]))", declared_metrics, "grouping")


def test_command_checks_reject_unknown_abbreviated_and_mistyped_flags():
    read_command(["recserve", "serve", "--watch", "/m", "--port", "50051"], "ok")
    with pytest.raises(AssertionError, match="--no-such-flag"):
        read_command(["recserve", "serve", "--no-such-flag", "1"], "unknown")
    with pytest.raises(AssertionError, match="--max-batch"):
        read_command(["recserve", "serve", "--watch", "/m", "--max-batch", "8"], "abbreviated")
    with pytest.raises(AssertionError, match="rejected by the real parser"):
        read_command(["recserve", "serve", "--watch", "/m", "--port", "grpc"], "mistyped")
    with pytest.raises(AssertionError, match="subcommands"):
        read_command(["recserve", "serve-model", "--port", "1"], "unknown subcommand")
    with pytest.raises(AssertionError, match="--nnode"):
        read_command(["torchrun", "--nnode", "2", "-m", "rectrain", "train", "--config", "x"], "torchrun")


def test_container_variables_must_be_defined_in_its_env():
    container = {"name": "c", "command": ["recserve"], "args": ["--out", "/m/$(VERSION)"]}
    with pytest.raises(AssertionError, match=r"\$\(VERSION\)"):
        container_argv(container, "pod")
    container["env"] = [{"name": "VERSION", "value": "3"}]
    assert container_argv(container, "pod") == ["recserve", "--out", "/m/3"]


def test_dockerignore_follows_dockers_last_match_rules(tmp_path: Path):
    path = tmp_path / ".dockerignore"
    path.write_text("*\n!src\nsrc/gen\n!src/gen/keep.py\n**/*.pyc\n")
    ignore = DockerIgnore(path)
    assert ignore.excluded("README.md") and ignore.excluded("tests/x.py")
    assert not ignore.excluded("src/a/b.py")
    assert ignore.excluded("src/gen/x.py") and not ignore.excluded("src/gen/keep.py")
    assert ignore.excluded("src/a/b.pyc")


def test_dockerfile_reader_joins_continuations_and_follows_stages(tmp_path: Path):
    path = tmp_path / "Dockerfile"
    path.write_text(
        "# syntax=docker/dockerfile:1\nARG BASE=debian:12\nFROM ${BASE} AS a\nUSER 7\nRUN echo 1 && \\\n"
        '    # a comment inside\n    echo 2\nFROM a AS b\nENTRYPOINT ["x"]\n'
    )
    dockerfile = read_dockerfile(path)
    assert [(s.name, s.base) for s in dockerfile.stages] == [("a", "debian:12"), ("b", "a")]
    assert dockerfile.stage("a").all("RUN") == ["echo 1 &&  echo 2"]
    assert dockerfile.inherited("b", "USER") == "7"
