"""``python -m bench``: every benchmark runs one way and is recorded with its machine; the README's
results tables are ``python -m bench table`` of the recorded results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from harness import Machine, Result, figures, load_results  # noqa: E402
from tables import TABLES, render  # noqa: E402


def bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_figure_lines_are_name_and_number_and_nothing_else():
    output = "\n".join(
        [
            "machine: AMD EPYC, 2 cores, ISA AVX-512",
            "rectrain train examples/s 34300",
            "ratio vs torchrec 2.37",
            "rectrain ebc (auto kernel) fwd+bwd vs raw fbgemm 0.217",
            "  run 1: rectrain 1, torchrec 2 examples/s",  # indented: commentary
            "capacity / in-process = 0.31 (goal >= 0.60)",  # words after the number: commentary
            "ratio vs torchrec 2.40",  # a later value of a name wins
        ]
    )
    assert figures(output) == {
        "rectrain train examples/s": 34300.0,
        "ratio vs torchrec": 2.40,
        "rectrain ebc (auto kernel) fwd+bwd vs raw fbgemm": 0.217,
    }


def test_list_names_every_benchmark_and_each_is_a_script():
    done = bench("list")
    assert done.returncode == 0, done.stderr
    for name in TABLES:
        assert (ROOT / "bench" / f"{name}.py").is_file(), name
        assert done.stdout.count(f"{name} ") >= 1
    assert bench("nonesuch").returncode == 2


def test_a_benchmarks_usage_text_is_shown_and_not_recorded(tmp_path):
    done = bench("--results", str(tmp_path), "freshness", "--help")
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
    assert "recorded " not in done.stdout and not list(tmp_path.rglob("*.json"))


@pytest.mark.slow
def test_a_run_is_recorded_with_machine_versions_and_figures(tmp_path):
    done = bench("--results", str(tmp_path), "compute_bound")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compute bound examples/s" in done.stdout and "recorded " in done.stdout
    (path,) = tmp_path.glob("*/compute_bound-*.json")
    data = json.loads(path.read_text())
    assert data["machine"]["line"].startswith(data["machine"]["cpu"]) and data["machine"]["cores"] >= 1
    assert data["machine"]["isa"] and {"python", "torch", "commit"} <= set(data["versions"])
    assert data["runs"][0]["compute bound examples/s"] > 0 and data["exit_code"] == 0
    table = bench("--results", str(tmp_path), "table").stdout
    assert data["machine"]["line"] in table and "| compute_bound | `-` | compute bound examples/s |" in table


def test_tables_take_each_benchmarks_newest_result_per_flags_and_show_the_range():
    machine = Machine("CPU X", "AVX2", 2, 24.0, "CPU X, 2 cores, ISA AVX2")
    old = Result(
        "train_throughput", ["--compare"], machine, {"commit": "a"}, "2026-01-01T00:00:00+00:00", 1, 0.5, 0
    )
    old.runs = [{"ratio vs torchrec": 1.0}]
    new = Result(
        "train_throughput", ["--compare"], machine, {"commit": "b"}, "2026-02-01T00:00:00+00:00", 1, 0.4, 0
    )
    new.runs = [{"ratio vs torchrec": 2.0}, {"ratio vs torchrec": 2.5}, {"ratio vs torchrec": 2.2}]
    table = render([old, new])
    assert "**CPU X, 2 cores, ISA AVX2** (2 cores, 24 GiB)" in table
    assert (
        "| train_throughput | `--compare` | ratio vs torchrec | 2.2 (2–2.5) | 3 | 2026-02-01, b | 0.4 |"
        in table
    )
    assert "1.0" not in table.replace("2026", "")


def test_the_readmes_results_are_the_recorded_results():
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- bench table: begin -->\n", "<!-- bench table: end -->"
    assert begin in readme and end in readme, "README.md: the results tables' markers are missing"
    block = readme.split(begin, 1)[1].split(end, 1)[0]
    assert block == render(load_results()), "README.md's results differ from `python -m bench table`"
