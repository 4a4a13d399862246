"""Several "hosts" on one machine: torchrun agents as separate processes meeting over c10d on loopback.

Each test starts real ``torchrun`` nodes that run the real ``rectrain train`` command, so ``LOCAL_WORLD_SIZE``
differs from ``WORLD_SIZE`` as on a cluster: the planner reads the host layout from the environment and
table-row-wise tables are sharded within a host. The "Several hosts" lines of docs/training.md and the
Kubernetes Job's exact command line run as two nodes each.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import tomllib

from rectrain.checkpoint import read_manifest
from tests.deploy.manifests import container_argv, k8s_object, pod_spec
from tests.distributed.agents import ROOT, TORCHRUN, Nodes, free_port, rank_env
from tests.train.test_job import SMALL_CRITEO_MODEL, write_criteo

EXAMPLES = ROOT / "examples"


def criteo_overrides(tmp_path: Path, train_rows: int, batch_size: int, *extra: str) -> list[str]:
    """A small table-row-wise DLRM on a Criteo-format file of ``train_rows`` rows, as config overrides."""
    data = write_criteo(tmp_path / "train.tsv", rows=train_rows)
    held_out = write_criteo(tmp_path / "eval.tsv", rows=2 * batch_size, seed=1)
    return [
        *SMALL_CRITEO_MODEL,
        f'data.paths=["{data}"]',
        f'data.eval_paths=["{held_out}"]',
        "data.num_workers=0",
        f"train.batch_size={batch_size}",
        "train.eval_batches=1",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        'planner.sharding_types=["table_row_wise"]',
        *extra,
    ]


def train_command(overrides: list[str]) -> list[str]:
    """``-m rectrain train`` of the Criteo example with ``overrides`` (what torchrun runs)."""
    command = ["-m", "rectrain", "train", "--config", str(EXAMPLES / "dlrm_criteo.toml"), "--no-progress"]
    return command + [arg for o in overrides for arg in ("--set", o)]


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def check_table_row_wise(manifest, hosts: int, local: int) -> None:
    """Every table is split into ``local`` row blocks, all on the ranks of one host."""
    assert manifest.plan["world_size"] == hosts * local and manifest.plan["local_world_size"] == local
    used_hosts = set()
    for key, table in manifest.tables.items():
        assert table.sharding_type == "table_row_wise", key
        ranks = sorted(s.rank for s in table.weight.shards)
        assert len(ranks) == local and len({r // local for r in ranks}) == 1, (key, ranks)
        used_hosts.add(ranks[0] // local)
    assert used_hosts == set(range(hosts)), "the planner spreads the tables over the hosts"


def documented_several_hosts() -> tuple[dict[str, str], list[str]]:
    """docs/training.md's "Several hosts" lines: the variables they export and the torchrun command."""
    text = (ROOT / "docs" / "training.md").read_text()
    section = text[text.index("## Several hosts") :]
    start = section.index("```bash") + len("```bash")
    lines = section[start : section.index("```", start)].replace("\\\n", " ").splitlines()
    exports = [line.split("#")[0].split(None, 1)[1].strip() for line in lines if line.startswith("export ")]
    (command,) = [shlex.split(line) for line in lines if line.startswith("torchrun ")]
    return dict(e.split("=", 1) for e in exports), command


@pytest.mark.slow
def test_two_nodes_of_two_ranks_run_the_documented_lines_with_table_row_wise_tables(tmp_path):
    exports, argv = documented_several_hosts()
    assert (argv[argv.index("--nnodes") + 1], argv[argv.index("--nproc-per-node") + 1]) == ("2", "2")
    endpoint = argv.index("--rdzv-endpoint") + 1
    assert argv[endpoint] == "head-node:29400"
    argv[endpoint] = f"127.0.0.1:{free_port()}"
    config = argv.index("--config") + 1
    shutil.copy(EXAMPLES / "dlrm_criteo.toml", tmp_path / argv[config])
    argv[config] = str(tmp_path / argv[config])
    rows, batch = 4 * 32 * 5, 32  # five steps of four ranks
    overrides = criteo_overrides(tmp_path, rows, batch, "train.epochs=1")
    command = [str(Path(TORCHRUN[0]).parent / "torchrun"), *argv[1:], "--no-progress"]
    command += [arg for o in overrides for arg in ("--set", o)]
    with Nodes(tmp_path) as nodes:
        for _ in range(2):
            nodes.start(command, env=rank_env(**exports))
        assert nodes.wait(timeout=300) == [0, 0], nodes.output()
    manifest = read_manifest(tmp_path / "ckpt")
    assert (manifest.step, manifest.world_size) == (5, 4)
    check_table_row_wise(manifest, hosts=2, local=2)
    assert manifest.extra["examples"] == rows
    assert manifest.data_position == {"epoch": 0, "offset": rows, "unit": "rows", "source": "criteo"}
    trained = [e for e in events(tmp_path / "metrics.jsonl") if e["event"] == "eval"]
    assert trained and trained[-1]["num_examples"] == 2 * batch


def _k8s_trainer() -> tuple[list[str], dict[str, str], str]:
    """The training Job's container command line, its literal environment variables and its run config."""
    job = k8s_object("Job", "rectrain-train")
    (container,) = pod_spec(job)["containers"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    config_map = k8s_object("ConfigMap", "rectrain-run")
    return container_argv(container, "train Job"), env, config_map["data"]["run.toml"]


def _shrunk_k8s_config(text: str, tmp_path: Path) -> str:
    """The Job's run config with its volume paths under ``tmp_path`` and a test-sized model and run."""
    changes = {
        "num_embeddings = 100_000": "num_embeddings = 1000",
        "steps = 5000": "steps = 6",
        "batch_size = 512": "batch_size = 64",
        "eval_every = 500": "eval_every = 3",
        "eval_batches = 20": "eval_batches = 2",
        "every_n_steps = 250": "every_n_steps = 3",
        '"/checkpoints/dlrm-metrics.jsonl"': json.dumps(str(tmp_path / "metrics.jsonl")),
        '"/checkpoints/dlrm"': json.dumps(str(tmp_path / "ckpt")),
    }
    for old, new in changes.items():
        assert old in text, f"the ConfigMap's run.toml no longer has {old!r}; update this test"
        text = text.replace(old, new)
    shrunk = text + '\n[planner]\nsharding_types = ["table_row_wise"]\n'
    tomllib.loads(shrunk)
    return shrunk


@pytest.mark.slow
def test_the_kubernetes_job_command_line_runs_as_two_nodes(tmp_path):
    argv, container_env, run_toml = _k8s_trainer()
    config = tmp_path / "run.toml"
    config.write_text(_shrunk_k8s_config(run_toml, tmp_path))
    assert argv[0] == "torchrun"
    endpoint = argv.index("--rdzv-endpoint") + 1
    # Pod 0's DNS name becomes loopback, the ConfigMap's mount path the test's copy; nothing else changes.
    argv[endpoint] = f"127.0.0.1:{free_port()}"
    argv[argv.index("--config") + 1] = str(config)
    torchrun = str(Path(TORCHRUN[0]).parent / "torchrun")
    with Nodes(tmp_path) as nodes:
        for _ in range(int(argv[argv.index("--nnodes") + 1])):
            # The pod's variables, but one intra-op thread per rank: this machine has two cores.
            nodes.start([torchrun, *argv[1:]], env=rank_env(**{**container_env, "OMP_NUM_THREADS": "1"}))
        assert nodes.wait(timeout=300) == [0, 0], nodes.output()
    manifest = read_manifest(tmp_path / "ckpt")
    assert (manifest.step, manifest.world_size) == (6, 2)
    check_table_row_wise(manifest, hosts=2, local=1)
    log = events(tmp_path / "metrics.jsonl")
    assert [e["step"] for e in log if e["event"] == "checkpoint"] == [3, 6]
    assert [e["step"] for e in log if e["event"] == "eval"] == [3, 6]
