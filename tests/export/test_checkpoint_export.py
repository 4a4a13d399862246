"""Export from training checkpoints: a 2-rank sharded checkpoint exports exactly like its 1-rank re-shard,
through the Python API and through ``recserve export`` on the command line."""

from __future__ import annotations

import json

import pytest
import torch

from recserve.cli import main
from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor, read_manifest
from rectrain.checkpoint import load_checkpoint, load_full_state, save_checkpoint
from rectrain.distributed import DistributedModelParallel
from rectrain.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from rectrain.embedding import FusedOptimizerConfig
from rectrain.models import Batch, build_train_model
from rectrain.planner import ShardingPlan
from tests.distributed.multiprocess import run_multiprocess
from tests.export.common import dlrm_config, request

CFG = dlrm_config()
EBC_PATH = "model.model.sparse_arch.embedding_bag_collection"


def _train_and_save(env, root: str) -> None:
    """Two ranks: t0 row-wise, t1 column-wise, t2/t3 table-wise; a few steps so tables move off init."""
    torch.manual_seed(0)
    model = build_train_model(CFG, fused_optimizer=FusedOptimizerConfig())
    per_table = {"t0": row_wise(), "t1": column_wise([0, 1]), "t2": table_wise(1), "t3": table_wise(0)}
    shapes = {t.name: (t.num_embeddings, t.embedding_dim) for t in CFG.tables}
    plan = ShardingPlan(
        {EBC_PATH: construct_module_sharding_plan(CFG.tables, per_table, world_size=env.world_size)},
        env.world_size,
        {EBC_PATH: shapes},
    )
    dmp = DistributedModelParallel(model, env=env, device="cpu", plan=plan)
    dense_params = [p for p in dmp.parameters() if p.requires_grad]
    optimizer = torch.optim.Adagrad(dense_params, lr=0.1)
    for step in range(3):
        dense, kjt = request(CFG, batch=8, seed=100 * step + env.rank)
        labels = torch.randint(0, 2, (8,), generator=torch.Generator().manual_seed(step))
        loss, _ = dmp(Batch(dense, kjt, labels))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_checkpoint(root, model=dmp, step=3, model_config=CFG, env=env)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    two = tmp_path_factory.mktemp("ckpt_two_ranks")
    run_multiprocess(_train_and_save, 2, str(two))
    one = tmp_path_factory.mktemp("ckpt_one_rank")
    model = build_train_model(CFG, fused_optimizer=FusedOptimizerConfig())  # save_checkpoint's kind
    load_checkpoint(two, model=model)
    save_checkpoint(one, model=model, step=3, model_config=CFG)
    return two, one


@pytest.mark.slow
def test_two_rank_checkpoint_exports_like_its_one_rank_reshard(checkpoints, tmp_path):
    sample = synthetic_sample(CFG, 256)
    packages = []
    for name, root in zip(("two", "one"), checkpoints):
        manifest, state = load_full_state(root)
        assert manifest.world_size == (2 if name == "two" else 1)
        packages.append(
            export_package(tmp_path / name, model_config=CFG, state_dict=state, accuracy_sample=sample)
        )
    two, one = (read_manifest(p) for p in packages)
    assert two.files["embeddings_0.safetensors"] == one.files["embeddings_0.safetensors"]  # same bytes
    assert two.files["dense.safetensors"] == one.files["dense.safetensors"]
    dense, kjt = request(CFG, batch=20, seed=9)
    a, b = (Predictor.load(p).predict(dense, kjt) for p in packages)
    assert torch.equal(a, b)


@pytest.mark.slow
def test_export_command_line(checkpoints, tmp_path, capsys):
    out = tmp_path / "pkg"
    code = main(
        ["export", "--checkpoint", str(checkpoints[0]), "--out", str(out), "--dtype", "int8"]
        + ["--table-dtype", "t3=int4", "--devices", "cpu:0,cpu:1"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "wrote" in printed and "t3: int4" in printed and "AUC diff" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["step"] == 3 and manifest["source"]["world_size"] == 2
    assert manifest["placement"]["devices"] == ["cpu:0", "cpu:1"]
    assert manifest["model_name"] == checkpoints[0].name  # the run, not "model"
    assert Predictor.load(out).metadata.table_dtypes["t3"] == "int4"


def test_export_command_line_errors_are_named(tmp_path, capsys):
    code = main(["export", "--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "p")])
    assert code == 2
    assert "recserve export: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--checkpoint", "x", "--out", "y", "--dtype", "int3"])
