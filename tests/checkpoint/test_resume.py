"""Resume is exact: N steps, save, resume in a fresh model, M steps == N + M uninterrupted steps, bitwise on
CPU (weights, fused and dense optimizer state, RNG), for 1 process and 2 gloo ranks with mixed sharding."""

from __future__ import annotations

import pytest
import torch

from rectrain.checkpoint import load_checkpoint, read_manifest, save_checkpoint, save_checkpoint_async
from tests.checkpoint import common
from tests.distributed.multiprocess import run_multiprocess

N, M = 3, 2


def _resume(env, root: str, plan: str | None, asynchronous: bool) -> dict:
    model = common.shard(common.build_model(seed=0), env, plan)
    optimizer = common.make_optimizer(model)
    common.train(model, optimizer, range(N), env.rank)
    rng_at_save = torch.get_rng_state()
    save = save_checkpoint_async if asynchronous else save_checkpoint
    handle = save(root, model=model, optimizer=optimizer, step=N, extra={"next_step": N}, env=env)
    common.train(model, optimizer, range(N, N + M), env.rank)  # an async save is still writing here
    if asynchronous:
        handle.wait()
    reference = common.capture(model, optimizer)

    fresh = common.shard(common.build_model(seed=1), env, plan)
    fresh_optimizer = common.make_optimizer(fresh)
    info = load_checkpoint(root, model=fresh, optimizer=fresh_optimizer)
    rng_restored = torch.equal(torch.get_rng_state(), rng_at_save)
    common.train(fresh, fresh_optimizer, range(info.extra["next_step"], N + M), env.rank)
    return {
        "mismatches": common.mismatches(reference, common.capture(fresh, fresh_optimizer)),
        "rng_restored": rng_restored,
        "step": info.step,
        "resharded": info.resharded,
        "files_read": info.files_read,
    }


def test_single_process_resume_is_bitwise_exact(tmp_path):
    from rectrain.distributed import ShardingEnv

    result = _resume(ShardingEnv.from_local(1, 0), str(tmp_path), None, False)
    assert result["mismatches"] == []
    assert result["rng_restored"] and result["step"] == N


@pytest.mark.slow
def test_two_rank_async_save_resume_is_bitwise_exact(tmp_path):
    results = run_multiprocess(_resume, 2, str(tmp_path), "tw_rw_cw", True)
    for rank, result in enumerate(results):
        assert result["mismatches"] == [], f"rank {rank}"
        assert result["rng_restored"] and not result["resharded"]
        # each rank reads only its own shards (and the dense state), not its peer's file
        assert result["files_read"] == ("dense.safetensors", f"rank_{rank}.safetensors")
    manifest = read_manifest(tmp_path)
    assert manifest.world_size == 2 and manifest.step == N
    assert sorted(manifest.files) == ["dense.safetensors", "rank_0.safetensors", "rank_1.safetensors"]
    kinds = {e.name: e.sharding_type for e in manifest.tables.values()}
    assert kinds == {"t0": "table_wise", "t1": "row_wise", "t2": "column_wise"}
    momentum = manifest.tables[f"{common.EBC_PATH}.embedding_bags.t2.weight"].optimizer_state["momentum1"]
    assert momentum.kind == "per_row" and [s.shape for s in momentum.shards] == [(30,), (30,)]
