"""Helpers of the TorchRec import tests: DCP checkpoints written by torch's own writer on real gloo ranks, a
TorchRec-layout two-tower state dict with TorchRec's forward, and the TorchRec reference venv's job."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch
from torch import Tensor

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.embedding import EmbeddingBagCollection
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

from .common import dlrm_config, trained_state

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("torchrec_dlrm_job.py")

# How each table of ``dlrm_config()`` is split over 2 ranks: [(rank, row range, column range), ...].
SPLITS = {
    "t0": [(0, (0, 110), (0, 8)), (1, (110, 300), (0, 8))],  # row-wise, uneven
    "t1": [(0, (0, 200), (0, 4)), (1, (0, 200), (4, 8))],  # column-wise
    "t2": [
        (r, rows, cols) for r, rows in enumerate([(0, 60), (60, 120)]) for cols in [(0, 4), (4, 8)]
    ],  # grid
}  # t3 is replicated on both ranks (data-parallel), so DCP keeps one copy


def _sharded(full: Tensor, rank: int, splits: list) -> object:
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardMetadata

    shards = [
        Shard(
            full[r0:r1, c0:c1].clone(),
            ShardMetadata([r0, c0], [r1 - r0, c1 - c0], f"rank:{owner}/cpu"),
        )
        for owner, (r0, r1), (c0, c1) in splits
        if owner == rank
    ]
    return ShardedTensor._init_from_local_shards(shards, *full.shape)


def save_sharded_dlrm(env: ShardingEnv, out: str) -> str:
    """On each of 2 ranks: ``dlrm_config()``'s trained state as a DMP(DLRMTrain) state dict with sharded
    tables and a fused-optimizer-like state, saved with ``torch.distributed.checkpoint``. Returns what
    importing the rank's sharded state dict in memory says."""
    import torch.distributed.checkpoint as dcp

    from recserve.errors import ExportError
    from recserve.export.torchrec_import import import_state_dict

    state = trained_state(dlrm_config())
    model, optim = {}, {}
    for key, value in state.items():
        table = key.split(".")[-2] if "embedding_bags" in key else None
        if table in SPLITS:
            value = _sharded(value, env.rank, SPLITS[table])
            optim[key] = {f"{table}.momentum1": _sharded(state[key] ** 2, env.rank, SPLITS[table])}
        model[key] = value  # DLRMTrain(DLRM)'s keys are DLRMPrediction's: "model." + DLRM's
    dcp.save({"model": model, "optim": {"state": optim}, "step": 7}, checkpoint_id=out)
    try:
        import_state_dict(dlrm_config(), model)
    except ExportError as error:
        return str(error)
    return "imported"


def two_tower_config() -> ModelConfig:
    from rectrain.embedding import EmbeddingBagConfig

    tables = [
        EmbeddingBagConfig(name="query", num_embeddings=50, embedding_dim=8, feature_names=["user"]),
        EmbeddingBagConfig(name="candidate", num_embeddings=80, embedding_dim=8, feature_names=["item"]),
    ]
    return ModelConfig(kind="two_tower", tables=tables, dense_in_features=0, tower_layer_sizes=[16, 8])


def torchrec_two_tower_state(cfg: ModelConfig, seed: int = 0) -> dict[str, Tensor]:
    """A TorchRec ``TwoTowerTrainTask(TwoTower(ebc, layer_sizes))`` state dict: ``two_tower.`` + TwoTower's
    keys, each tower an ``MLP`` (``_mlp.<i>._linear``) of ``tower_layer_sizes``."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for table in cfg.tables:
        weight = torch.randn(table.num_embeddings, table.embedding_dim, generator=gen) * 0.3
        state[f"two_tower.ebc.embedding_bags.{table.name}.weight"] = weight
    for tower in ("query_proj", "candidate_proj"):
        width = cfg.tables[0].embedding_dim
        for i, size in enumerate(cfg.tower_layer_sizes):
            state[f"two_tower.{tower}._mlp.{i}._linear.weight"] = (
                torch.randn(size, width, generator=gen) * 0.5
            )
            state[f"two_tower.{tower}._mlp.{i}._linear.bias"] = torch.randn(size, generator=gen) * 0.1
            width = size
    return state


def torchrec_two_tower_logits(cfg: ModelConfig, state: dict[str, Tensor], kjt: KeyedJaggedTensor) -> Tensor:
    """TorchRec's TwoTower forward, written out: pooled features, a ReLU after every tower layer, <q, c>."""
    ebc = EmbeddingBagCollection(list(cfg.tables))
    ebc.load_state_dict({k[len("two_tower.ebc.") :]: v for k, v in state.items() if ".ebc." in k})
    pooled = ebc(kjt).to_dict()

    def tower(name: str, x: Tensor) -> Tensor:
        for i in range(len(cfg.tower_layer_sizes)):
            prefix = f"two_tower.{name}._mlp.{i}._linear"
            x = torch.relu(torch.nn.functional.linear(x, state[f"{prefix}.weight"], state[f"{prefix}.bias"]))
        return x

    with torch.no_grad():
        return (tower("query_proj", pooled["user"]) * tower("candidate_proj", pooled["item"])).sum(1)


def torchrec_venv() -> Path:
    """The TorchRec 1.8.0 reference venv (built by scripts/torchrec_venv.sh on first use)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "torchrec_venv.sh")], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


def run_torchrec_job(out: Path, *kinds: str) -> None:
    """Train and save a TorchRec DLRM of each of ``kinds`` on 2 gloo ranks in one launch, each in
    ``out/<kind>`` (see torchrec_dlrm_job.py)."""
    venv = torchrec_venv()
    command = [str(venv / "bin" / "torchrun"), "--standalone", "--nproc_per_node", "2", str(JOB)]
    command += ["--out", str(out), *[arg for kind in kinds for arg in ("--kind", kind)]]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)  # the job runs on TorchRec's venv alone
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=out)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
