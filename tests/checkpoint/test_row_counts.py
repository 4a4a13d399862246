"""Row counts: training counts each row's lookups on the rank that owns the row, and a checkpoint keeps them
exactly across a resume and a re-shard from 2 ranks (table-, row-, column-wise) to 3 (other types)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from recserve.export.sources import CheckpointSource
from rectrain.checkpoint import load_checkpoint, model_state, save_checkpoint
from rectrain.checkpoint.cli import format_info
from rectrain.checkpoint.manifest import read_manifest, resolve_step_dir
from rectrain.distributed.sharded.row_counts import track_row_counts
from tests.checkpoint import common
from tests.distributed.multiprocess import run_multiprocess


def _counted_model(env, plan: str, seed: int):
    model = common.shard(common.build_model(seed=seed), env, plan)
    assert track_row_counts(model) == 1
    return model, common.make_optimizer(model)


def _counts(model) -> dict[str, list[tuple[int, int, Tensor]]]:
    return {
        key: [(p.shard.row_offset, p.shard.num_rows, p.counts.clone()) for p in table.pieces]
        for key, table in model_state.local_tables(model).items()
    }


def _save(env, root: str) -> dict:
    model, optimizer = _counted_model(env, "tw_rw_cw", seed=0)
    common.train(model, optimizer, range(3), env.rank)
    model.eval()
    model(common.batch(99, env.rank))  # an evaluation forward counts nothing
    save_checkpoint(root, model=model, optimizer=optimizer, step=3, env=env)
    return _counts(model)


def _resume(env, root: str) -> dict:
    model, optimizer = _counted_model(env, "rw_cw_tw", seed=7)
    load_checkpoint(root, model=model, optimizer=optimizer)
    loaded = _counts(model)
    common.train(model, optimizer, range(3, 4), env.rank)  # the re-sharded model counts on
    return {"loaded": loaded, "trained": _counts(model)}


def _expected(batches: list[tuple[int, int]]) -> dict[str, Tensor]:
    """Every table's counts over ``(step, rank)`` batches, from the batches' ids."""
    counts = {f"{common.EBC_PATH}.embedding_bags.t{i}.weight": torch.zeros(n, dtype=torch.int32) for i, n in
              enumerate(common.ROWS)}  # fmt: skip
    for step, rank in batches:
        kjt = common.batch(step, rank).sparse_features
        for i, ids in enumerate(kjt.values().split(kjt.length_per_key())):
            key = f"{common.EBC_PATH}.embedding_bags.t{i}.weight"
            counts[key] += torch.bincount(ids, minlength=common.ROWS[i]).int()
    return counts


def _check(pieces: dict, expected: dict) -> int:
    checked = 0
    for key, table_pieces in pieces.items():
        for start, rows, counts in table_pieces:
            assert counts.dtype == torch.int32
            assert torch.equal(counts, expected[key][start : start + rows]), (key, start)
            checked += 1
    return checked


@pytest.mark.slow  # spawns 2 then 3 ranks
def test_counts_survive_resume_and_reshard_two_to_three(tmp_path):
    root = str(tmp_path / "ckpt")
    saved = run_multiprocess(_save, 2, root, timeout=600)
    before = _expected([(s, r) for s in range(3) for r in range(2)])
    assert sum(_check(p, before) for p in saved) == 1 + 2 + 2  # t0 whole, t1 two row shards, t2 two columns
    assert any(c.sum() > 0 for p in saved for pieces in p.values() for _, _, c in pieces)

    manifest = read_manifest(resolve_step_dir(root))
    assert all(t.row_counts is not None for t in manifest.tables.values())
    assert "row counts" in format_info(manifest, root)
    with CheckpointSource(root) as source:  # what export prunes by: whole tables, column shards merged
        for key, counts in before.items():
            assert torch.equal(source.counts(key.removeprefix("model.")), counts), key

    resumed = run_multiprocess(_resume, 3, root, timeout=600)
    assert sum(_check(r["loaded"], before) for r in resumed) == 3 + 2 + 1
    after = _expected([(s, r) for s in range(3) for r in range(2)] + [(3, r) for r in range(3)])
    assert sum(_check(r["trained"], after) for r in resumed) == 3 + 2 + 1
