"""``export_pipeline``: two exported packages + an item catalogue -> a pipeline package (see ``manifest``).

Order of work: fit the stages to each other and to the catalogue's columns (one-line PipelineError); read the
catalogue once to count rows and values and check every id against the tables that read it; copy the stage
packages into the staging directory; read the catalogue again, a batch at a time, writing the item features
and the candidate tower's embeddings (computed by the copied retrieval package, so export and serving embed
with the same quantized weights); build the index over the mapped embeddings; publish atomically. Memory:
one catalogue batch, plus the index.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from recserve.errors import ExportError
from recserve.recommend.catalogue import Catalogue, ItemBatch
from recserve.recommend.index import build_index, write_index
from recserve.recommend.manifest import (
    EMBEDDINGS_FILE,
    INDEX_FILE,
    ITEMS_FILE,
    Limits,
    PipelineManifest,
)
from recserve.recommend.stages import PipelineError, StagePlan, plan_stages
from recserve.recommend.towers import Towers
from recserve.runtime.package import MANIFEST_FILE, read_manifest, verify_files, version_problem
from recserve.runtime.predictor import Predictor
from rectrain.durable import fsync_path, sha256_file
from rectrain.safetensors_io import SafetensorsWriter, TensorSpec

logger = logging.getLogger(__name__)


@dataclass
class _Counts:
    rows: int
    values: dict[str, int]


def _check_ids(batch: ItemBatch, plan: StagePlan, where: Path) -> None:
    for feature in {*plan.candidate_features, *plan.ranking_item_features}:
        values = batch.sparse[feature][1]
        bound = plan.num_embeddings[feature]
        if values.numel() and int(values.max()) >= bound:
            lengths = batch.sparse[feature][0]
            row = int(torch.repeat_interleave(torch.arange(len(batch)), lengths)[values >= bound][0])
            raise PipelineError(
                f"{where}: item {int(batch.item_ids[row])} (row {batch.first + row}): {feature} id "
                f"{int(values.max())} is outside the tables that read it ([0, {bound}))"
            )


def _count(catalogue: Catalogue, plan: StagePlan, rows: int) -> _Counts:
    counts = _Counts(0, {f: 0 for f in plan.ranking_item_features})
    ids = []
    for batch in catalogue.batches(rows):
        _check_ids(batch, plan, catalogue.path)
        counts.rows += len(batch)
        for f in counts.values:
            counts.values[f] += int(batch.sparse[f][1].numel())
        ids.append(batch.item_ids)
    if counts.rows == 0:
        raise ExportError(f"{catalogue.path}: the catalogue has no item")
    all_ids = torch.cat(ids)
    unique = torch.unique(all_ids)
    if unique.numel() != all_ids.numel():
        sorted_ids = torch.sort(all_ids).values
        repeated = int(sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]][0])
        raise ExportError(f"{catalogue.path}: item_id {repeated} appears more than once")
    return counts


def _item_specs(plan: StagePlan, counts: _Counts) -> list[TensorSpec]:
    specs = [TensorSpec("item_ids", torch.int64, (counts.rows,))]
    for f in plan.ranking_item_features:
        specs.append(TensorSpec(f"{f}.offsets", torch.int64, (counts.rows + 1,)))
        specs.append(TensorSpec(f"{f}.values", torch.int64, (counts.values[f],)))
    specs.append(TensorSpec("dense", torch.float32, (counts.rows, len(plan.item_dense))))
    return specs


def _write_items(
    catalogue: Catalogue, plan: StagePlan, counts: _Counts, towers: Towers, staging: Path, rows: int
) -> None:
    items = SafetensorsWriter(staging / ITEMS_FILE, _item_specs(plan, counts), {"format": "pt"})
    dim = plan.embedding_dim
    vectors = SafetensorsWriter(
        staging / EMBEDDINGS_FILE,
        [TensorSpec("embeddings", torch.float32, (counts.rows, dim))],
        {"format": "pt"},
    )
    written = dict.fromkeys(plan.ranking_item_features, 0)
    for f in written:
        items.write(f"{f}.offsets", torch.zeros(1, dtype=torch.int64))
    for batch in catalogue.batches(rows):
        items.write("item_ids", batch.item_ids, batch.first)
        for f in written:
            lengths, values = batch.sparse[f]
            items.write(f"{f}.offsets", written[f] + torch.cumsum(lengths, 0), batch.first + 1)
            items.write(f"{f}.values", values, written[f])
            written[f] += int(values.numel())
        items.write("dense", batch.dense, batch.first)
        bags = {f: batch.sparse[f] for f in plan.candidate_features}
        vectors.write("embeddings", towers.embed("candidate", bags, len(batch)), batch.first)
    items.close()
    vectors.close()


def _sample_queries(towers: Towers, plan: StagePlan, count: int, seed: int) -> torch.Tensor:
    """Query embeddings of ``count`` users with one uniform id per query feature (the recall sample)."""
    generator = torch.Generator().manual_seed(seed)
    bags = {
        f: (
            torch.ones(count, dtype=torch.int64),
            torch.randint(0, plan.num_embeddings[f], (count,), generator=generator),
        )
        for f in plan.query_features
    }
    return towers.embed("query", bags, count)


def export_pipeline(
    out_dir: str | Path,
    *,
    retrieval: str | Path,
    ranking: str | Path,
    catalogue: str | Path,
    user_dense: int | None = None,
    limits: Limits | None = None,
    index: str = "auto",
    target_recall: float = 0.96,
    recall_queries: int = 256,
    batch_rows: int = 65_536,
    model_name: str = "recommend",
    version: str = "1",
    overwrite: bool = False,
    seed: int = 0,
) -> Path:
    """Write a pipeline package (see :mod:`recserve.recommend.manifest`) and return its directory."""
    out = Path(out_dir)
    limits = limits or Limits()
    problem = version_problem(str(version))
    if problem:
        raise ExportError(f"--version: {problem}")
    if not (1 <= limits.top_k <= limits.max_k and 1 <= limits.num_candidates <= limits.max_candidates):
        raise ExportError(
            f"limits: need 1 <= top_k <= max_k and 1 <= num_candidates <= max_candidates, got {limits}"
        )
    manifests = {}
    for stage, path in (("retrieval", Path(retrieval)), ("ranking", Path(ranking))):
        manifests[stage] = read_manifest(path)
        verify_files(path, manifests[stage])
    items = Catalogue(catalogue)
    plan = plan_stages(manifests["retrieval"], manifests["ranking"], items.columns, user_dense)
    counts = _count(items, plan, batch_rows)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out}: exists and is not empty; choose a new directory or pass overwrite")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        stages = {}
        for stage, path in (("retrieval", Path(retrieval)), ("ranking", Path(ranking))):
            shutil.copytree(path, staging / stage)
            stages[stage] = {
                "package": stage,
                "manifest_sha256": sha256_file(staging / stage / MANIFEST_FILE),
            }
        towers = Towers(Predictor.load(staging / "retrieval"))
        _write_items(items, plan, counts, towers, staging, batch_rows)
        embeddings = _map_embeddings(staging / EMBEDDINGS_FILE)
        queries = _sample_queries(towers, plan, recall_queries, seed)
        built, choice = build_index(
            embeddings,
            queries,
            kind=index,
            recall_at=min(100, limits.num_candidates),
            target_recall=target_recall,
        )
        write_index(built, staging / INDEX_FILE)
        del built, embeddings
        files = {}
        for name in (ITEMS_FILE, EMBEDDINGS_FILE, INDEX_FILE):
            fsync_path(staging / name)
            files[name] = {"sha256": sha256_file(staging / name), "bytes": (staging / name).stat().st_size}
        manifest = PipelineManifest(
            model_name=model_name,
            version=str(version),
            plan=plan,
            limits=limits,
            catalogue={
                "source": Path(catalogue).name,
                "rows": counts.rows,
                "sparse": items.columns.sparse,
                "dense": items.columns.dense,
            },
            index=choice.to_dict(),
            stages={**stages, "filter": {"exclude": "ids given in the request are never returned"}},
            files=files,
        )
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest.to_dict(), indent=1) + "\n")
        fsync_path(staging / MANIFEST_FILE)
        fsync_path(staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
        fsync_path(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("exported pipeline %s: %d items, %s index", out, counts.rows, choice.type)
    return out


def _map_embeddings(path: Path) -> torch.Tensor:
    from recserve.recommend.items import map_tensors

    return map_tensors(path)["embeddings"]
