"""A small real pipeline: a two-tower package, a DLRM ranking package and a generated TSV catalogue."""

from __future__ import annotations

from pathlib import Path

import torch

from recserve.export import export_package
from recserve.recommend.export import export_pipeline
from recserve.recommend.manifest import Limits
from rectrain import EmbeddingBagConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

USERS, ITEMS, GENRES, USER_DENSE = 50, 300, 7, 2


def two_tower_config() -> ModelConfig:
    tables = [
        EmbeddingBagConfig(name="user_t", num_embeddings=USERS, embedding_dim=8, feature_names=["user"]),
        EmbeddingBagConfig(name="item_t", num_embeddings=ITEMS, embedding_dim=8, feature_names=["item"]),
    ]
    return ModelConfig(kind="two_tower", tables=tables, dense_in_features=0, tower_layer_sizes=[16, 8])


def ranking_config(dense: int = USER_DENSE + 1, genre_rows: int = GENRES) -> ModelConfig:
    tables = [
        EmbeddingBagConfig(name="r_users", num_embeddings=USERS, embedding_dim=8, feature_names=["user"]),
        EmbeddingBagConfig(name="r_items", num_embeddings=ITEMS, embedding_dim=8, feature_names=["item"]),
        EmbeddingBagConfig(
            name="genres", num_embeddings=genre_rows, embedding_dim=8, feature_names=["genre"]
        ),
    ]
    return ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=dense, dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
    )  # fmt: skip


def export_model(out: Path, cfg: ModelConfig, name: str, seed: int) -> Path:
    torch.manual_seed(seed)
    model = build_model(cfg)
    return export_package(
        out, model_config=cfg, state_dict=model.state_dict(), model_name=name, dtype="fp16", force=True
    )


def write_catalogue(path: Path, items: int = ITEMS) -> Path:
    lines = ["item_id\titem\tgenre\tdense:popularity"]
    for i in range(items):
        genres = ",".join(str(g) for g in sorted({i % GENRES, (i * 3) % GENRES}))
        lines.append(f"{1000 + i}\t{i}\t{genres}\t{(i % 13) / 13:.4f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def make_pipeline(root: Path, **options) -> Path:
    retrieval = export_model(root / "tt", two_tower_config(), "towers", seed=1)
    ranking = export_model(root / "rank", ranking_config(), "ranker", seed=2)
    catalogue = write_catalogue(root / "items.tsv")
    limits = options.pop("limits", Limits(num_candidates=50, max_candidates=400, top_k=10, max_k=50))
    return export_pipeline(
        root / "pipe", retrieval=retrieval, ranking=ranking, catalogue=catalogue, limits=limits, **options
    )


def user_batch(users: list[int], seed: int = 0) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """Dense ``[B, USER_DENSE]`` and a KJT of the user feature (one id per user)."""
    g = torch.Generator().manual_seed(seed)
    kjt = KeyedJaggedTensor(
        keys=["user"], values=torch.tensor(users), lengths=torch.ones(len(users), dtype=torch.int64)
    )
    return torch.randn(len(users), USER_DENSE, generator=g), kjt
