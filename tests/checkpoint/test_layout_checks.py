"""Every loader refuses a manifest whose shards overlap or leave their table, with ``ckpt verify``'s message,
before reading a tensor: resume on 2 ranks, eval on 1, export (full state) and offline re-sharding."""

from __future__ import annotations

import json
import re

import pytest

from rectrain.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rectrain.checkpoint.load import load_full_state
from rectrain.checkpoint.offline import reshard_checkpoint
from rectrain.checkpoint.verify import verify_checkpoint
from tests.checkpoint import common
from tests.distributed.multiprocess import run_multiprocess


def _save(env, root: str) -> None:
    model = common.shard(common.build_model(seed=0), env, "tw_rw_cw")
    optimizer = common.make_optimizer(model)
    common.train(model, optimizer, range(2), env.rank)
    save_checkpoint(root, model=model, optimizer=optimizer, step=2, env=env)


def _resume(env, root: str) -> str:
    model = common.shard(common.build_model(seed=1), env, "tw_rw_cw")
    try:
        load_checkpoint(root, model=model, optimizer=common.make_optimizer(model), env=env)
    except CheckpointError as error:
        return str(error)
    return "loaded"


def _move_row_wise_shard(step_dir, shift: int) -> str:
    """Move the second shard of the row-wise table t1 ``shift`` rows up; the problem verify reports."""
    path = step_dir / "manifest.json"
    data = json.loads(path.read_text())
    key = f"{common.EBC_PATH}.embedding_bags.t1.weight"
    shards = sorted(data["tables"][key]["weight"]["shards"], key=lambda s: s["row_offset"])
    assert data["tables"][key]["sharding_type"] == "row_wise" and len(shards) == 2
    shards[1]["row_offset"] -= shift  # 32 -> 16 here, like 5000 -> 4000 in the issue
    path.write_text(json.dumps(data))
    problems = verify_checkpoint(step_dir).problems
    assert len(problems) == 1, problems
    return problems[0]


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    run_multiprocess(_save, 2, str(root))
    problem = _move_row_wise_shard(root / "step_2", 16)
    assert re.fullmatch(r"table 't1' \(.*t1\.weight\) weight: shards in rank_\d\.safetensors and "
                        r"rank_\d\.safetensors overlap at row 16", problem)  # fmt: skip
    return root, problem


@pytest.mark.slow
def test_resume_on_two_ranks_is_refused_with_verifys_message(overlapping):
    root, problem = overlapping
    for message in run_multiprocess(_resume, 2, str(root)):
        assert problem in message and "rectrain ckpt verify" in message


@pytest.mark.slow
def test_eval_export_and_reshard_are_refused_with_verifys_message(overlapping, tmp_path):
    root, problem = overlapping
    with pytest.raises(CheckpointError, match=re.escape(problem)):
        load_checkpoint(root, model=common.build_model(seed=1))  # eval: one rank, weights only
    with pytest.raises(CheckpointError, match=re.escape(problem)):
        load_full_state(root)  # what `recserve export` reads
    with pytest.raises(CheckpointError, match=re.escape(problem)):
        reshard_checkpoint(root, world_size=1, out=tmp_path / "out")


def test_ckpt_info_names_the_overlap_and_fails(overlapping, capsys):
    from rectrain.cli import main

    root, problem = overlapping
    assert main(["ckpt", "info", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"LAYOUT PROBLEM {problem}" in out and "1 layout problem(s)" in out


def test_shard_outside_its_table_is_refused_before_reading(tmp_path):
    model = common.build_model(seed=0)
    save_checkpoint(tmp_path, model=model, optimizer=common.make_optimizer(model), step=1)
    path = tmp_path / "step_1" / "manifest.json"
    data = json.loads(path.read_text())
    key = f"{common.EBC_PATH}.embedding_bags.t0.weight"
    data["tables"][key]["weight"]["shards"][0]["num_rows"] = -(2**62)
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"table 't0' .* lies outside the table \[40, 8\]"):
        load_checkpoint(tmp_path, model=common.build_model(seed=1))
    assert any("lies outside the table" in p for p in verify_checkpoint(tmp_path).problems)


@pytest.mark.parametrize("lr", ["0.1", float("nan"), -1.0, True])
def test_unusable_learning_rate_in_the_manifest_is_named(tmp_path, lr):
    model = common.build_model(seed=0)
    save_checkpoint(tmp_path, model=model, optimizer=common.make_optimizer(model), step=1)
    path = tmp_path / "step_1" / "manifest.json"
    data = json.loads(path.read_text())
    (collection,) = data["collections"].values()
    collection["fused_optimizer"]["lr"] = lr
    path.write_text(json.dumps(data))
    fresh = common.build_model(seed=1)
    with pytest.raises(CheckpointError, match=r"fused_optimizer\.lr must be a finite number >= 0"):
        load_checkpoint(tmp_path, model=fresh, optimizer=common.make_optimizer(fresh))


def test_a_collection_built_torchrecs_way_is_refused_by_name(tmp_path):
    import torch

    from rectrain import EmbeddingBagCollection, EmbeddingBagConfig

    model = torch.nn.Sequential()
    model.add_module(
        "ebc", EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4)])
    )
    with pytest.raises(CheckpointError, match="'ebc' was built without fused_optimizer="):
        save_checkpoint(tmp_path / "ckpt", model=model, step=1)
