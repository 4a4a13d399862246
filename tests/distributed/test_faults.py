"""Faults under torchrun: a killed rank restarts the group and the job resumes by itself, a lost node is
dropped and the checkpoint re-sharded, a killed agent leaves no rank behind, a hung rank is named, SIGTERM
saves. Every test runs the real ``rectrain train`` under real ``torchrun`` agents on loopback."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from rectrain.checkpoint import load_full_state, read_manifest
from rectrain.distributed import ShardingEnv
from rectrain.train.config import RunConfig
from rectrain.train.job import TrainJob
from tests.distributed.agents import (
    TORCHRUN,
    Nodes,
    free_port,
    is_alive,
    rank_of,
    torchrun_args,
    wait_for,
)
from tests.distributed.multiprocess import run_multiprocess
from tests.distributed.test_multinode import EXAMPLES, criteo_overrides, events, train_command


def _checkpointed(tmp_path: Path):
    return lambda: any(e["event"] == "checkpoint" for e in events(tmp_path / "metrics.jsonl"))


def _trained(tmp_path: Path, steps: int = 1):
    return lambda: sum(e["event"] == "train" for e in events(tmp_path / "metrics.jsonl")) >= steps


def _train_rank(env: ShardingEnv, overrides: list[str]) -> int:
    TrainJob(RunConfig.load(EXAMPLES / "dlrm_criteo.toml", overrides), env, progress_bar=False).run()
    return env.rank


@pytest.mark.slow
def test_a_killed_rank_restarts_the_group_which_resumes_and_ends_like_an_uninterrupted_run(tmp_path):
    steps, batch = 160, 32
    rows = 2 * batch * steps
    run = ["train.epochs=1", "checkpoint.every_n_steps=20", "checkpoint.keep_last=20", "train.log_every=5"]
    overrides = criteo_overrides(tmp_path, rows, batch, *run)
    command = TORCHRUN + torchrun_args(2, 1, free_port(), max_restarts=1) + train_command(overrides)
    with Nodes(tmp_path) as nodes:
        nodes.start(command)
        second = nodes.start(command)
        (victim,) = nodes.ranks_of(second, 1)
        wait_for(_checkpointed(tmp_path), 180, "the first checkpoint", nodes)
        os.kill(victim, signal.SIGKILL)
        assert nodes.wait(timeout=300) == [0, 0], nodes.output()
    log = events(tmp_path / "metrics.jsonl")
    assert max(e["step"] for e in log if e["event"] == "train") == steps, "it was killed before the end"
    assert "restart" in nodes.output().lower()
    restarts = [e for e in log if e["event"] == "resume"]  # where the second attempt's steps start
    assert restarts and restarts[0]["attempt"] == 1 and restarts[0]["step"] % 20 == 0
    resumed = read_manifest(tmp_path / "ckpt")
    assert (resumed.step, resumed.extra["examples"]) == (steps, rows)
    assert resumed.data_position["offset"] == rows

    reference = tmp_path / "reference"
    reference_overrides = [*overrides, f'checkpoint.dir="{reference}"', 'train.metrics_log="/dev/null"']
    run_multiprocess(_train_rank, 2, reference_overrides, local_world_size=1, timeout=240)
    expected_manifest, expected = load_full_state(reference)
    _, actual = load_full_state(tmp_path / "ckpt")
    assert expected_manifest.extra == resumed.extra
    assert expected.keys() == actual.keys()
    for name, tensor in expected.items():
        assert torch.equal(tensor, actual[name]), name


@pytest.mark.slow
def test_a_lost_node_is_dropped_and_the_other_resumes_alone_from_a_resharded_checkpoint(tmp_path):
    steps, batch = 150, 32
    rows = 2 * batch * steps
    run = ["train.epochs=1", "checkpoint.every_n_steps=10", "train.log_every=5"]
    overrides = criteo_overrides(tmp_path, rows, batch, *run)
    port = free_port()
    elastic = torchrun_args("1:2", 1, port, max_restarts=1)
    # Short rendezvous waits: 2 s for more nodes once one is there, a node dead after 2 missed heartbeats.
    conf = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=2,is_host="
    with Nodes(tmp_path) as nodes:
        host = nodes.start(TORCHRUN + elastic + ["--rdzv-conf", conf + "1"] + train_command(overrides))
        other = nodes.start(TORCHRUN + elastic + ["--rdzv-conf", conf + "0"] + train_command(overrides))
        (orphan,) = nodes.ranks_of(other, 1)
        wait_for(_checkpointed(tmp_path), 180, "the first checkpoint", nodes)
        other.kill()
        wait_for(lambda: not is_alive(orphan), 10, "the lost node's rank to end with its agent", nodes)
        assert host.wait(timeout=300) == 0, nodes.output()
    assert "re-sharded" in nodes.output(tail=1_000_000)
    final = read_manifest(tmp_path / "ckpt")
    assert final.world_size == 1
    # Every row once: the steps of two ranks before the loss, of one rank after, cover the file exactly.
    assert final.data_position == {"epoch": 0, "offset": rows, "unit": "rows", "source": "criteo"}
    assert final.extra["examples"] == rows


@pytest.mark.slow
def test_killing_the_agent_leaves_no_rank_and_no_later_checkpoint(tmp_path):
    run = ["train.epochs=1", "checkpoint.every_n_steps=5", "train.log_every=1"]
    overrides = criteo_overrides(tmp_path, 2 * 32 * 2000, 32, *run)
    command = TORCHRUN + torchrun_args(1, 2, free_port()) + train_command(overrides)
    with Nodes(tmp_path) as nodes:
        agent = nodes.start(command)
        ranks = nodes.ranks_of(agent, 2)
        wait_for(_checkpointed(tmp_path), 180, "the first checkpoint", nodes)
        agent.kill()
        killed_at = time.monotonic()
        wait_for(lambda: not any(is_alive(r) for r in ranks), 10, "the ranks to end with their agent", nodes)
        ended_in = time.monotonic() - killed_at
        before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
        time.sleep(3)
        after = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert ended_in < 10 and before == after


@pytest.mark.slow
def test_a_hung_rank_is_named_by_the_others_within_the_collective_timeout(tmp_path):
    run = ["train.epochs=1", "train.collective_timeout_s=4", "train.log_every=1", 'checkpoint.dir=""']
    overrides = criteo_overrides(tmp_path, 2 * 32 * 2000, 32, *run)
    command = TORCHRUN + torchrun_args(1, 2, free_port()) + train_command(overrides)
    with Nodes(tmp_path) as nodes:
        agent = nodes.start(command)
        ranks = nodes.ranks_of(agent, 2)
        # Past the first steps: DDP rebuilds its buckets in the second forward, a gloo call of its own that
        # the collective timeout does not name (a rank stopped there ends with gloo's own error).
        wait_for(_trained(tmp_path, steps=3), 180, "training to start", nodes)
        hung = next(pid for pid in ranks if rank_of(pid) == 1)
        os.kill(hung, signal.SIGSTOP)  # alive but stuck: gloo alone would wait for it
        stopped_at = time.monotonic()
        message = re.compile(r"collective \S.* failed on rank 0 \(timeout 4 s\): rank 1 did not reach it")
        wait_for(lambda: message.search(nodes.output(tail=100_000)), 60, "rank 0 to name rank 1", nodes)
        named_in = time.monotonic() - stopped_at
        os.kill(hung, signal.SIGCONT)
        assert agent.wait(timeout=120) != 0
    assert named_in < 4 + 4 + 30, "timeout + grace + a loaded machine's slack"


@pytest.mark.slow
def test_sigterm_to_the_agent_saves_the_last_step(tmp_path):
    run = ["train.epochs=1", "train.log_every=1"]
    overrides = criteo_overrides(tmp_path, 2 * 32 * 2000, 32, *run)
    command = TORCHRUN + torchrun_args(1, 2, free_port()) + train_command(overrides)
    with Nodes(tmp_path) as nodes:
        agent = nodes.start(command)
        wait_for(_trained(tmp_path), 180, "training to start", nodes)
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(timeout=120)
    log = events(tmp_path / "metrics.jsonl")
    saved = [e["step"] for e in log if e["event"] == "checkpoint"]
    assert saved and saved[-1] == max(e["step"] for e in log if e["event"] == "train")
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"step_{saved[-1]}"
    assert "stop requested (SIGTERM): checkpointing" in nodes.output(tail=100_000)
    assert code != 0, "torchrun reports a run stopped before its end as failed, so it is restarted"
