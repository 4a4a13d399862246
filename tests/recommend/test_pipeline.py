"""The pipeline package: export from a catalogue, the in-process recommend(), the filter, refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from recserve.errors import ExportError, InvalidRequestError, PackageError
from recserve.recommend.export import export_pipeline
from recserve.recommend.manifest import read_pipeline
from recserve.recommend.pipeline import RecommendPipeline
from recserve.recommend.stages import PipelineError
from recserve.recommend.towers import bags_to_kjt
from tests.recommend.fixtures import (
    ITEMS,
    USER_DENSE,
    export_model,
    ranking_config,
    user_batch,
    write_catalogue,
)


@pytest.fixture(scope="module")
def pipeline(pipeline_dir) -> RecommendPipeline:
    return RecommendPipeline.load(pipeline_dir)


def test_export_lists_and_records_every_part(pipeline_dir):
    manifest = read_pipeline(pipeline_dir)
    assert set(manifest.files) == {"items.safetensors", "embeddings.safetensors", "index.faiss"}
    assert manifest.catalogue["rows"] == ITEMS and manifest.catalogue["dense"] == ["popularity"]
    assert manifest.index["type"] == "flat" and manifest.index["recall"]["value"] == 1.0
    plan = manifest.plan
    assert plan.user_features == ["user"] and plan.ranking_item_features == ["item", "genre"]
    assert plan.user_dense == USER_DENSE


def test_items_hold_the_catalogue(pipeline):
    items = pipeline.items
    assert items.item_ids.tolist() == [1000 + i for i in range(ITEMS)]
    offsets, values = items.features["genre"]
    row = 10  # genres {10 % 7, 30 % 7} = {3, 2}
    assert values[offsets[row] : offsets[row + 1]].tolist() == [2, 3]
    assert items.dense[row].item() == pytest.approx(10 / 13, abs=1e-4)
    assert items.widths == {"item": 1}  # one id per item; genre bags hold one or two


def test_recommendations_are_the_ranking_models_top_k(pipeline):
    dense, kjt = user_batch([4, 9])
    recs = pipeline.recommend(dense, kjt, k=7, num_candidates=40)
    query = pipeline.towers.embed("query", {"user": (torch.ones(1, dtype=torch.int64), torch.tensor([9]))}, 1)
    exact = torch.topk(query @ pipeline.embeddings.T, 40).indices[0]
    # Rank user 9's exact candidates with the ranking package directly.
    genre_offsets, genre_values = pipeline.items.features["genre"]
    genres = [genre_values[genre_offsets[r] : genre_offsets[r + 1]] for r in exact.tolist()]
    bags = {
        "user": (torch.ones(40, dtype=torch.int64), torch.full((40,), 9)),
        "item": (torch.ones(40, dtype=torch.int64), exact.clone()),
        "genre": (torch.tensor([len(g) for g in genres]), torch.cat(genres)),
    }
    rank_dense = torch.cat([dense[1:2].expand(40, -1), pipeline.items.dense[exact]], dim=1)
    scores = pipeline.ranker.predict(
        rank_dense, bags_to_kjt(pipeline.ranker.metadata.feature_names, bags, 40)
    )
    best = torch.sort(scores, descending=True, stable=True).indices[:7]
    assert recs[1].item_ids.tolist() == (1000 + exact[best]).tolist()
    torch.testing.assert_close(recs[1].scores, scores[best])
    assert recs[1].candidates == 40 and len(recs[0].item_ids) == 7


def test_filter_never_returns_an_excluded_id(pipeline):
    dense, kjt = user_batch([5])
    top = pipeline.recommend(dense, kjt, k=10, num_candidates=ITEMS)[0].item_ids.tolist()
    for count in range(1, 11):  # excluded ids in every position of the exact top-K, then all of them
        excluded = top[:count]
        recs = pipeline.recommend(dense, kjt, k=10, num_candidates=ITEMS, exclude=[excluded])[0]
        assert not set(recs.item_ids.tolist()) & set(excluded)
        assert recs.item_ids.tolist()[: 10 - count] == top[count:]
    # The index is searched past the excluded ids, so a request still gets num_candidates candidates.
    assert pipeline.recommend(dense, kjt, k=5, num_candidates=20, exclude=[top])[0].candidates == 20


def test_bad_requests_are_named(pipeline):
    dense, kjt = user_batch([1])
    with pytest.raises(InvalidRequestError, match="^k: 0 is outside|^k: 51 is outside"):
        pipeline.check(dense, kjt, k=51)
    with pytest.raises(InvalidRequestError, match="num_candidates: 401"):
        pipeline.check(dense, kjt, num_candidates=401)
    with pytest.raises(InvalidRequestError, match="exclude: 1001 ids"):
        pipeline.check(dense, kjt, exclude=list(range(1001)))
    bad_dense, bad_kjt = user_batch([50])  # USERS == 50: id 50 is outside the user table
    with pytest.raises(InvalidRequestError, match="user"):
        pipeline.check(bad_dense, bad_kjt)
    with pytest.raises(InvalidRequestError, match="dense"):
        pipeline.check(torch.zeros(1, USER_DENSE + 1), kjt)


def _stages(tmp_path):
    from tests.recommend.fixtures import two_tower_config

    return export_model(tmp_path / "tt", two_tower_config(), "towers", 1), write_catalogue(tmp_path / "c.tsv")


def test_a_ranking_model_that_does_not_fit_is_refused_in_one_line(tmp_path):
    retrieval, catalogue = _stages(tmp_path)
    wide = export_model(tmp_path / "wide", ranking_config(dense=2), "r", 2)
    with pytest.raises(PipelineError) as error:
        export_pipeline(tmp_path / "p", retrieval=retrieval, ranking=wide, catalogue=catalogue, user_dense=2)
    assert "\n" not in str(error.value) and "dense_in_features 2" in str(error.value)
    small = export_model(tmp_path / "small", ranking_config(genre_rows=3), "r", 2)
    with pytest.raises(PipelineError, match=r"genre id 6 is outside the tables that read it \(\[0, 3\)\)"):
        export_pipeline(tmp_path / "p", retrieval=retrieval, ranking=small, catalogue=catalogue)
    assert not (tmp_path / "p").exists()


def test_a_catalogue_without_the_candidate_feature_is_refused(tmp_path):
    retrieval, _ = _stages(tmp_path)
    ranking = export_model(tmp_path / "rank", ranking_config(), "r", 2)
    catalogue = tmp_path / "no_item.tsv"
    catalogue.write_text("item_id\tgenre\tdense:popularity\n1\t2\t0.5\n")
    with pytest.raises(PipelineError, match="candidate feature 'item' is not a column of the catalogue"):
        export_pipeline(tmp_path / "p", retrieval=retrieval, ranking=ranking, catalogue=catalogue)
    catalogue.write_text("item_id\titem\tgenre\tdense:popularity\n1\t2\tx\t0.5\n")
    with pytest.raises(ExportError, match=r"no_item.tsv:2: genre: expected a non-negative int64, got 'x'"):
        export_pipeline(tmp_path / "p", retrieval=retrieval, ranking=ranking, catalogue=catalogue)


def test_a_changed_file_is_refused_at_load(pipeline_dir, tmp_path):
    copy = shutil.copytree(pipeline_dir, tmp_path / "copy")
    with open(copy / "index.faiss", "r+b") as f:
        f.seek(40)
        f.write(b"\xff\xff")
    with pytest.raises(PackageError, match="index.faiss: sha256"):
        RecommendPipeline.load(copy)
    copy = shutil.copytree(pipeline_dir, tmp_path / "copy2")
    manifest = json.loads((copy / "ranking" / "manifest.json").read_text())
    manifest["model_name"] = "other"
    (copy / "ranking" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="ranking/manifest.json: sha256 .* stages.ranking"):
        RecommendPipeline.load(copy)


def test_parquet_catalogue_gives_the_same_items(pipeline_dir, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [line.split("\t") for line in (pipeline_dir.parent / "items.tsv").read_text().splitlines()[1:]]
    table = pa.table(
        {
            "item_id": [int(r[0]) for r in rows],
            "item": [int(r[1]) for r in rows],
            "genre": [[int(g) for g in r[2].split(",")] for r in rows],
            "dense:popularity": [float(r[3]) for r in rows],
        }
    )
    pq.write_table(table, tmp_path / "items.parquet")
    out = export_pipeline(
        tmp_path / "p",
        retrieval=pipeline_dir / "retrieval",
        ranking=pipeline_dir / "ranking",
        catalogue=tmp_path / "items.parquet",
    )
    a = (out / "items.safetensors").read_bytes()
    assert a == (pipeline_dir / "items.safetensors").read_bytes()
