"""``torch.save`` state dicts (TorchRec's ``model.pt``) export through torch's weights-only unpickler: plain
tensors, and ``ShardedTensor`` tables saved by a one-rank job (read without a process group); a file saved
by one rank of two lacks the other's shards and is refused by name, a foreign global before it runs."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from recserve.errors import ExportError
from recserve.export import export_package
from recserve.export.torch_save_reader import read_torch_save
from recserve.export.torchrec_import import load_torchrec
from recserve.runtime import Predictor
from rectrain.sparse import KeyedJaggedTensor
from tests.distributed.multiprocess import run_multiprocess

from .torchrec_fixtures import torchrec_two_tower_logits, torchrec_two_tower_state, two_tower_config


def _request(batch: int = 12) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 4, (2 * batch,), generator=gen)
    values = torch.cat(
        [
            torch.randint(0, 50, (int(lengths[:batch].sum()),), generator=gen),
            torch.randint(0, 80, (int(lengths[batch:].sum()),), generator=gen),
        ]
    )
    return KeyedJaggedTensor.from_lengths_sync(keys=["user", "item"], values=values, lengths=lengths)


def _save_sharded(env, path: str) -> None:
    """TorchRec's two-tower state with its tables as ShardedTensors split by rows over the ranks; rank 0
    saves it as the retrieval example does (``torch.save(model.state_dict(), path)`` on rank 0)."""
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardMetadata

    state = torchrec_two_tower_state(two_tower_config())
    for key, value in list(state.items()):
        if ".embedding_bags." in key:
            rows = value.shape[0]
            bounds = [rows * r // env.world_size for r in range(env.world_size + 1)]
            lo, hi = bounds[env.rank], bounds[env.rank + 1]
            meta = ShardMetadata([lo, 0], [hi - lo, value.shape[1]], f"rank:{env.rank}/cpu")
            state[key] = ShardedTensor._init_from_local_shards(
                [Shard(value[lo:hi].clone(), meta)], *value.shape
            )
    if env.rank == 0:
        torch.save(state, path)


def test_a_plain_torch_save_state_dict_serves_torchrecs_scores(tmp_path):
    cfg = two_tower_config()
    state = torchrec_two_tower_state(cfg)
    torch.save(state, tmp_path / "model.pt")
    imported_cfg, imported, source = load_torchrec(tmp_path / "model.pt", cfg)
    assert source["format"] == "torch.save"
    path = export_package(tmp_path / "pkg", model_config=imported_cfg, state_dict=imported, dtype="fp32")
    kjt = _request()
    served = Predictor.load(path).predict_logits(torch.zeros(12, 0), kjt)
    assert torch.allclose(served, torchrec_two_tower_logits(cfg, state, kjt), rtol=0, atol=1e-6)


def test_sharded_tables_saved_by_one_rank_are_read_without_a_process_group(tmp_path):
    run_multiprocess(_save_sharded, 1, str(tmp_path / "model.pt"))
    assert not torch.distributed.is_initialized()
    cfg = two_tower_config()
    imported_cfg, imported, _ = load_torchrec(tmp_path / "model.pt", cfg)
    path = export_package(tmp_path / "pkg", model_config=imported_cfg, state_dict=imported, dtype="fp32")
    kjt = _request()
    expected = torchrec_two_tower_logits(cfg, torchrec_two_tower_state(cfg), kjt)
    assert torch.allclose(Predictor.load(path).predict_logits(torch.zeros(12, 0), kjt), expected, atol=1e-6)


def test_a_file_of_one_rank_of_two_is_refused_naming_dcp(tmp_path):
    run_multiprocess(_save_sharded, 2, str(tmp_path / "model.pt"))
    with pytest.raises(ExportError, match="shards on other ranks.*torch.distributed.checkpoint"):
        load_torchrec(tmp_path / "model.pt", two_tower_config())


class _Evil:
    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_foreign_global_is_refused_before_it_runs(tmp_path):
    evil = _Evil()
    evil.marker = tmp_path / "ran"
    torch.save({"x": evil}, tmp_path / "model.pt")
    with pytest.raises(
        ExportError, match=re.escape("not a torch.save state dict that loads with weights only")
    ):
        read_torch_save(tmp_path / "model.pt")
    assert not evil.marker.exists()


def test_the_cli_exports_a_model_pt(tmp_path):
    from recserve.cli import main as recserve_main

    cfg = two_tower_config()
    torch.save(torchrec_two_tower_state(cfg), tmp_path / "model.pt")
    (tmp_path / "model.json").write_text(json.dumps(cfg.to_dict()))
    argv = [
        "export",
        "--from-torchrec",
        str(tmp_path / "model.pt"),
        "--model-config",
        str(tmp_path / "model.json"),
    ]
    assert recserve_main([*argv, "--out", str(tmp_path / "pkg"), "--dtype", "fp32"]) == 0
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert manifest["source"]["format"] == "torch.save"
