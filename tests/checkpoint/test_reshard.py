"""Re-shard on load: a checkpoint saved with one world size and plan loads into another, optimizer state
included: 2 -> 1 (plain module), 2 -> 3 and 1 -> 2 with different sharding types per table.

Expected values come from the source ranks' own pieces: weights and per-element state are cut from the full
table; row-wise Adagrad state is the width-weighted mean over column shards when merging and the saved value
when splitting (see ``rectrain.checkpoint.reader``).
"""

from __future__ import annotations

import pytest
import torch

from rectrain.checkpoint import load_checkpoint, save_checkpoint
from rectrain.distributed import ShardingEnv
from tests.checkpoint import common
from tests.distributed.multiprocess import run_multiprocess


def _save(env, root: str, plan: str | None, optimizer_name: str) -> dict:
    model = common.shard(common.build_model(seed=0, optimizer=optimizer_name), env, plan)
    optimizer = common.make_optimizer(model)
    common.train(model, optimizer, range(3), env.rank)
    save_checkpoint(root, model=model, optimizer=optimizer, step=3, env=env)
    return common.capture(model, optimizer)


def _load(env, root: str, plan: str | None, optimizer_name: str) -> dict:
    model = common.shard(common.build_model(seed=7, optimizer=optimizer_name), env, plan)
    optimizer = common.make_optimizer(model)
    info = load_checkpoint(root, model=model, optimizer=optimizer)
    captured = common.capture(model, optimizer)
    common.train(model, optimizer, range(3, 4), env.rank)  # the re-sharded model trains on
    return {**captured, "resharded": info.resharded}


def _check(sources: list[dict], targets: list[dict]) -> int:
    """Assert every target piece equals the expectation from the sources; return the pieces checked."""
    full = common.full_tables(sources)
    checked = 0
    for target in targets:
        assert target["resharded"]
        for key, pieces in target["pieces"].items():
            for rect, weight, states in pieces:
                assert torch.equal(weight, common.expected_piece(full[key], "weight", rect)), (key, rect)
                for name, value in states.items():
                    expected = common.expected_piece(full[key], name, rect)
                    torch.testing.assert_close(value, expected, rtol=1e-6, atol=0, msg=f"{key}{rect} {name}")
                checked += 1
        for name, value in target["dense"].items():
            assert torch.equal(value, sources[0]["dense"][name]), name
        for index, state in target["optim"].items():
            for name, value in state.items():
                assert torch.equal(value, sources[0]["optim"][index][name]), (index, name)
    return checked


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt2")
    return root, run_multiprocess(_save, 2, str(root), "tw_rw_cw", "rowwise_adagrad")


@pytest.mark.slow
def test_two_ranks_to_one_unsharded_module(two_rank_checkpoint):
    root, sources = two_rank_checkpoint
    target = _load(ShardingEnv.from_local(1, 0), str(root), None, "rowwise_adagrad")
    assert _check(sources, [target]) == 3


@pytest.mark.slow
def test_two_ranks_to_three_with_other_sharding_types(two_rank_checkpoint):
    root, sources = two_rank_checkpoint
    targets = run_multiprocess(_load, 3, str(root), "rw_cw_tw", "rowwise_adagrad")
    assert _check(sources, targets) == 3 + 2 + 1  # t0 row-wise on 3, t1 two column shards, t2 one table


@pytest.mark.slow
@pytest.mark.parametrize("optimizer_name", ["adagrad", "adam"])
def test_one_process_to_two_ranks(tmp_path, optimizer_name):
    source = _save(ShardingEnv.from_local(1, 0), str(tmp_path), None, optimizer_name)
    targets = run_multiprocess(_load, 2, str(tmp_path), "cw_dp_rw", optimizer_name)
    assert _check([source], targets) == 2 * (1 + 1 + 1)  # per rank: a column shard, the replica, a row block
