"""The README's path from your own file to a served model, run as written on a small Criteo-format file.

The commands are read from README.md between the ``quickstart`` markers, so the test fails when the README
drifts from the CLIs. They run in a temporary directory holding the README's data file name (a few hundred
generated rows) and a link to ``examples/``. What the test changes, and only that: ``rectrain`` / ``recserve``
become their entry points (``rectrain.cli:main`` / ``recserve.cli:main``, what the installed commands run) in
this process, except the server, which the README runs in the background: it is this interpreter's ``-m``
command in its own process; the README's ports become free loopback ports, and the ``TEST_ONLY_*`` flags
below keep it small (a tiny model, one server worker on a shared 2-core machine).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import tomllib

from recserve.cli import main as recserve_main
from recserve.mainjob.stages import ServerProcess, cli, free_port
from rectrain.cli import main as rectrain_main
from tests.train.test_job import SMALL_CRITEO_MODEL, write_criteo

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- quickstart: begin -->", "<!-- quickstart: end -->"
ROWS = 400

# A 26 x 50 x 8 DLRM in small batches instead of the recipe's 26 x 100k x 64 tables: seconds, not minutes.
TEST_ONLY_TRAIN_OVERRIDES = [
    *SMALL_CRITEO_MODEL,
    "train.batch_size=32",
    "data.num_workers=0",
    "train.eval_batches=2",
]
# One worker: the README's default is one per core, and the test shares 2 cores with others.
TEST_ONLY_SERVE_FLAGS = ["--workers", "1"]


def readme_quickstart() -> list[list[str]]:
    """The README's quickstart commands as argv lists (continuations joined, comments dropped)."""
    text = (ROOT / "README.md").read_text()
    assert BEGIN in text and END in text, "README.md: the quickstart markers are missing"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    body = block.split("```bash\n", 1)[1].rsplit("```", 1)[0]
    lines = body.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def sets(argv: list[str]) -> dict[str, object]:
    """``--set key=value`` overrides of a ``rectrain train`` command, values parsed as TOML."""
    pairs = [argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--set"]
    return {key: tomllib.loads(f"v = {value}")["v"] for key, value in pairs}


@pytest.mark.slow
def test_the_readme_takes_your_own_file_to_a_served_model_and_a_score(tmp_path, monkeypatch, capsys):
    train, export, serve, query = readme_quickstart()
    assert train[:2] == ["rectrain", "train"] and export[:2] == ["recserve", "export"]
    assert serve[:2] == ["recserve", "serve"] and serve[-1] == "&" and query[:2] == ["recserve", "query"]

    # The README's relative paths, in a scratch directory: its data file, and examples/ of this checkout.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (data_file,) = sets(train)["data.paths"]
    write_criteo(tmp_path / data_file, rows=ROWS)

    # The CLIs' entry points in this process: a new interpreter per command would only add torch's import.
    train = [*train[1:], "--no-progress", *[arg for o in TEST_ONLY_TRAIN_OVERRIDES for arg in ("--set", o)]]
    assert rectrain_main(train) == 0, capsys.readouterr().err[-3000:]

    assert recserve_main(export[1:]) == 0, capsys.readouterr().err[-3000:]
    assert (tmp_path / option(export, "--out") / "manifest.json").is_file()

    ports = {option(serve, flag): str(free_port()) for flag in ("--port", "--metrics-port")}
    serve = [ports.get(arg, arg) for arg in serve[1:-1]]
    serve = [*cli("recserve"), *serve, "--admin-port", str(free_port()), *TEST_ONLY_SERVE_FLAGS]
    host, port = option(query, "--target").rsplit(":", 1)
    target = f"{host}:{ports[port]}"
    query = [a.replace(f":{port}", f":{ports[port]}") for a in query[1:]]

    capsys.readouterr()
    with ServerProcess(serve, target, tmp_path / "serve.log", start_timeout_s=120) as server:
        code = recserve_main(query)
    done = capsys.readouterr()
    assert code == 0, done.out[-3000:] + done.err[-3000:]
    assert server.exit_code == 0, (tmp_path / "serve.log").read_text()[-3000:]

    reply = json.loads(done.out.strip().splitlines()[-1])
    assert reply["model_name"] == option(export, "--model-name")
    assert reply["scores"] and all(0.0 < s < 1.0 for s in reply["scores"])
