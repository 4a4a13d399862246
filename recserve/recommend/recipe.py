"""The recommendation recipe, end to end on generated data (docs/recommend.md#recipe):

    python -m recserve.recommend.recipe [--out runs/recommend] [--users 2000] [--items 2000] [--steps 300]
    ./run.sh --recommend [same flags]

Users and items fall in ``--clusters`` taste clusters; each user interacts with items of its cluster, two of
which are held out. A two-tower model (in-batch softmax) and a DLRM ranking model (interactions against
random negatives) are trained on the rest, exported (fp16 tables), joined with the item catalogue into a
pipeline package (an IVF index, so that retrieval is approximate), served by a real server, and asked over
gRPC for each user's top K with the user's training items excluded. The recipe prints recall@K of the held-out
items for the served recommendations and for the same pipeline offline with exact retrieval.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import grpc
import torch

from recserve.export import export_package
from recserve.recommend.export import export_pipeline
from recserve.recommend.manifest import Limits
from recserve.recommend.pipeline import RecommendPipeline
from recserve.server.dataplane.arrays import encode_raw
from rectrain import EmbeddingBagConfig
from rectrain.models import build_train_model
from rectrain.models.batch import Batch
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

logger = logging.getLogger(__name__)


def _kjt(columns: dict[str, torch.Tensor]) -> KeyedJaggedTensor:
    keys = list(columns)
    batch = int(next(iter(columns.values())).numel())
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.cat([columns[k] for k in keys]),
        lengths=torch.ones(batch * len(keys), dtype=torch.int64),
    )


def generate(users: int, items: int, clusters: int, per_user: int, seed: int):
    """``(train pairs [P, 2], held-out items per user)``: each user's items come from its own cluster."""
    g = torch.Generator().manual_seed(seed)
    cluster_items = [torch.arange(c, items, clusters) for c in range(clusters)]
    train, held = [], []
    for user in range(users):
        pool = cluster_items[user % clusters]
        picked = pool[torch.randperm(pool.numel(), generator=g)[:per_user]]
        held.append(picked[:2])
        train.append(torch.stack([torch.full((per_user - 2,), user), picked[2:]], dim=1))
    return torch.cat(train), held


def _train(model: torch.nn.Module, batches, steps: int, lr: float) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss = torch.zeros(())
    for step in range(steps):
        loss = model(batches(step))[0]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss)


def train_models(args: argparse.Namespace, pairs: torch.Tensor, out: Path) -> tuple[Path, Path]:
    torch.manual_seed(args.seed)
    tables = [
        EmbeddingBagConfig(
            name="user_t", num_embeddings=args.users, embedding_dim=32, feature_names=["user"]
        ),
        EmbeddingBagConfig(
            name="item_t", num_embeddings=args.items, embedding_dim=32, feature_names=["item"]
        ),
    ]
    tower_cfg = ModelConfig(kind="two_tower", tables=tables, dense_in_features=0, tower_layer_sizes=[64, 32])
    towers = build_train_model(tower_cfg, temperature=0.1)

    def tower_batch(step: int) -> Batch:
        rows = pairs[torch.randint(0, pairs.shape[0], (args.batch,))]
        kjt = _kjt({"user": rows[:, 0], "item": rows[:, 1]})
        return Batch(torch.zeros(args.batch, 0), kjt, torch.ones(args.batch))

    logger.info("two-tower loss %.3f", _train(towers, tower_batch, args.steps, 0.01))
    rank_tables = [
        EmbeddingBagConfig(
            name="r_user", num_embeddings=args.users, embedding_dim=16, feature_names=["user"]
        ),
        EmbeddingBagConfig(
            name="r_item", num_embeddings=args.items, embedding_dim=16, feature_names=["item"]
        ),
        EmbeddingBagConfig(
            name="genre_t", num_embeddings=args.clusters, embedding_dim=16, feature_names=["genre"]
        ),
    ]
    rank_cfg = ModelConfig(
        kind="dlrm",
        tables=rank_tables,
        dense_in_features=2,  # the user's activity, then the item's popularity
        dense_arch_layer_sizes=[32, 16],
        over_arch_layer_sizes=[32, 1],
    )
    ranker = build_train_model(rank_cfg)

    def rank_batch(step: int) -> Batch:
        half = args.batch // 2
        rows = pairs[torch.randint(0, pairs.shape[0], (half,))]
        negatives = torch.randint(0, args.items, (half,))
        users = torch.cat([rows[:, 0], rows[:, 0]])
        items = torch.cat([rows[:, 1], negatives])
        kjt = _kjt({"user": users, "item": items, "genre": items % args.clusters})
        dense = torch.stack([torch.ones(2 * half), (items % 7).float() / 7], dim=1)
        return Batch(dense, kjt, torch.cat([torch.ones(half), torch.zeros(half)]))

    logger.info("ranking loss %.3f", _train(ranker, rank_batch, args.steps, 0.01))
    retrieval = export_package(
        out / "towers", model_config=tower_cfg, state_dict=towers.prediction_model.state_dict(),
        model_name="towers", dtype="fp16", force=True, overwrite=True,
    )  # fmt: skip
    ranking = export_package(
        out / "ranker", model_config=rank_cfg, state_dict=ranker.prediction_model.state_dict(),
        model_name="ranker", dtype="fp16", force=True, overwrite=True,
    )  # fmt: skip
    return retrieval, ranking


def write_catalogue(path: Path, items: int, clusters: int) -> Path:
    lines = ["item_id\titem\tgenre\tdense:popularity"]
    lines += [f"{i}\t{i}\t{i % clusters}\t{(i % 7) / 7:.6f}" for i in range(items)]
    path.write_text("\n".join(lines) + "\n")
    return path


def served_recall(target: str, users: int, pairs: torch.Tensor, held: list[torch.Tensor], k: int) -> float:
    from recserve.server.transports.protos import pb2, pb2_grpc

    stub = pb2_grpc.PredictorStub(grpc.insecure_channel(target))
    hits = 0
    for user in range(users):
        req = pb2.RecommendRequest(k=k, exclude_item_ids=pairs[pairs[:, 0] == user, 1].tolist())
        req.dense.raw = encode_raw(torch.ones(1, 1), "float32")
        req.sparse.keys.append("user")
        req.sparse.lengths_raw = encode_raw(torch.ones(1), "int32")
        req.sparse.values_raw = encode_raw(torch.tensor([user]), "int64")
        got = set(stub.Recommend(req, timeout=60).item_ids)
        hits += len(got & set(held[user].tolist()))
    return hits / (2 * users)


def offline_recall(pipeline: RecommendPipeline, pairs, held, users: int, k: int) -> float:
    hits = 0
    for start in range(0, users, 64):
        ids = torch.arange(start, min(users, start + 64))
        kjt = KeyedJaggedTensor(keys=["user"], values=ids, lengths=torch.ones(ids.numel(), dtype=torch.int64))
        exclude = [pairs[pairs[:, 0] == u, 1].tolist() for u in ids.tolist()]
        recs = pipeline.recommend(torch.ones(ids.numel(), 1), kjt, k=k, exclude=exclude)
        for u, rec in zip(ids.tolist(), recs):
            hits += len(set(rec.item_ids.tolist()) & set(held[u].tolist()))
    return hits / (2 * users)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="two-tower + DLRM recommendation recipe on generated data")
    parser.add_argument("--out", type=Path, default=Path("runs/recommend"))
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--clusters", type=int, default=20)
    parser.add_argument("--per-user", type=int, default=12)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from recserve.server.operations.app import RecServer
    from recserve.server.operations.config import ServeConfig

    args.out.mkdir(parents=True, exist_ok=True)
    pairs, held = generate(args.users, args.items, args.clusters, args.per_user, args.seed)
    retrieval, ranking = train_models(args, pairs, args.out)
    catalogue = write_catalogue(args.out / "items.tsv", args.items, args.clusters)
    limits = Limits(num_candidates=args.candidates, top_k=args.k, max_exclude=max(1000, args.per_user))
    pipe = export_pipeline(
        args.out / "pipeline", retrieval=retrieval, ranking=ranking, catalogue=catalogue, limits=limits,
        index="ivf", overwrite=True,
    )  # fmt: skip
    exact = offline_recall(RecommendPipeline.load(pipe, exact=True), pairs, held, args.users, args.k)
    server = RecServer(ServeConfig(package=pipe, port=0, metrics_port=None, admin_port=None, http_port=None))
    server.start()
    try:
        served = served_recall(f"127.0.0.1:{server.port}", args.users, pairs, held, args.k)
    finally:
        server.stop()
    index = json.loads((pipe / "manifest.json").read_text())["index"]
    summary = {
        "users": args.users,
        "items": args.items,
        "index": index["type"],
        "index_params": index["params"],
        f"recall@{args.k} served (ANN)": round(served, 4),
        f"recall@{args.k} offline (exact)": round(exact, 4),
        f"chance recall@{args.k}": round(args.k / args.items, 4),
    }
    print(json.dumps(summary, indent=1))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
