"""Modules at TorchRec's paths only re-export or adapt; the engine is elsewhere (issue 44's visible boundary).

A rectrain module whose dotted path is a TorchRec 1.8.0 module (``torchrec.X`` -> ``rectrain.X``) may hold at
most ``BUDGET`` lines of functions and classes: enough for TorchRec's enums and config dataclasses, a stub
that refuses what rectrain does not run, or a small wrapper, not for a second implementation. Lines are
counted with ``ast`` (nothing is imported): every top-level function and class, and every top-level statement
that is not an import, an assignment (an alias table), a docstring, ``if TYPE_CHECKING`` or a ``try``. The
modules in ``ALLOWED`` exceed it, each for the reason given; the list must stay current (an entry that fits
the budget again, or no longer exists, fails). CI has no TorchRec tree, so ``TORCHREC_1_8`` lists, for each
package of rectrain that TorchRec 1.8.0 also has, the names of TorchRec's modules and subpackages in it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 40

TORCHREC_1_8 = {
    "": (
        "__init__ datasets distributed fx inference metrics models modules optim pt2 quant schema sparse "
        "streamable tensor_types test_utils types utils"
    ),
    "datasets": "__init__ criteo movielens random scripts test_utils tests utils",
    "datasets.test_utils": "__init__ criteo_test_utils",
    "distributed": (
        "__init__ batched_embedding_kernel benchmark collective_utils comm comm_ops composable dist_data "
        "embedding embedding_dim_bucketer embedding_kernel embedding_lookup embedding_sharding "
        "embedding_tower_sharding embedding_types embeddingbag fbgemm_qcomm_codec feature_score_utils "
        "fp_embeddingbag fused_embedding fused_embeddingbag fused_params global_settings "
        "grouped_position_weighted infer_utils itep_embeddingbag keyed_jagged_tensor_pool logger "
        "logging_handlers logging_utils mc_embedding mc_embedding_modules mc_embeddingbag mc_modules "
        "memory_stashing model_parallel model_tracker object_pool pec_collision_handlers pec_comm_ops "
        "pec_embedding planner quant_embedding quant_embedding_kernel quant_embeddingbag quant_state "
        "shard sharded_relay_utils sharding sharding_plan shards_wrapper tensor_pool tensor_sharding "
        "test_utils tests train_pipeline types utils"
    ),
    "distributed.model_tracker": "__init__ delta_store model_delta_tracker tests trackers types",
    "distributed.planner": (
        "__init__ constants enumerators estimator partitioners perf_models planners proposers "
        "shard_estimators stats storage_reservations types utils"
    ),
    "distributed.sharding": (
        "__init__ cw_sequence_sharding cw_sharding dp_sequence_sharding dp_sharding dynamic_sharding "
        "grid_sharding rw_kjt_pool_sharding rw_pool_sharding rw_sequence_sharding rw_sharding "
        "rw_tensor_pool_sharding sequence_sharding tw_sequence_sharding tw_sharding twcw_sharding "
        "twrw_sharding"
    ),
    "distributed.test_utils": (
        "__init__ emb_sharder infer_utils input_config metric_config model_config model_input "
        "multi_process pipeline_config process_runner sharding_config table_config test_model "
        "test_model_parallel test_model_parallel_base test_modules test_sharding"
    ),
    "fx": "__init__ tracer utils",
    "inference": (
        "__init__ client dlrm_packager dlrm_predict inference_legacy model_packager modules "
        "state_dict_transform"
    ),
    "metrics": (
        "__init__ accuracy auc auprc average cali_free_ne calibration calibration_with_recalibration "
        "cpu_comms_metric_module cpu_offloaded_metric_module ctr deferrable_metrics gauc "
        "hindsight_target_pr mae metric_job_types metric_module metric_state_snapshot metrics_config "
        "metrics_namespace model_utils mse multi_label_precision multiclass_recall ndcg ne ne_positive "
        "ne_with_recalibration nmse noop_metric_module num_missing_labels num_positive_samples output "
        "precision precision_session rauc rec_metric recall recall_session scalar segmented_ne "
        "serving_calibration serving_ne sum_weights tensor_weighted_avg test_utils throughput tower_qps "
        "unweighted_ne weighted_avg weighted_sum_predictions xauc"
    ),
    "models": "__init__ cuda_graph_benchmark cuda_graph_utils deepfm dlrm experimental tests",
    "modules": (
        "__init__ activation crossnet debug_embedding_modules deepfm embedding_configs embedding_modules "
        "embedding_tower feature_processor feature_processor_ fp_embedding_modules "
        "fused_embedding_modules hash_mc_evictions hash_mc_metrics hash_mc_modules itep_embedding_modules "
        "itep_modules keyed_jagged_tensor_pool lazy_extension mc_adapter mc_embedding_modules mc_modules "
        "mlp object_pool object_pool_lookups pec_embedding_modules pruning_logger regroup tensor_pool "
        "tests utils"
    ),
    "optim": (
        "__init__ apply_optimizer_in_backward clipping fused keyed optimizers rowwise_adagrad semi_sync "
        "test_utils tests warmup"
    ),
    "optim.test_utils": "__init__",
    "schema": "__init__ api_tests test_schema_utils utils",
    "sparse": "__init__ jagged_tensor jagged_tensor_validator tensor_dict test_utils tests",
    "sparse.tests": (
        "__init__ jagged_tensor_benchmark keyed_jagged_tensor_benchmark keyed_jagged_tensor_benchmark_lib "
        "permute_2d_benchmark test_jagged_tensor test_jagged_tensor_validator test_keyed_jagged_tensor "
        "test_keyed_tensor test_tensor_dict utils"
    ),
}

_ENGINE_PACKAGE = "the engine's own package at TorchRec's name (one implementation, no second one elsewhere)"
_FIXTURE = "test fixtures TorchRec's tests and users' tests import: models and inputs, not engine code"
ALLOWED = {
    "rectrain.distributed.embedding": "TorchRec's tests patch construct_jagged_tensors at this path, which "
    "EmbeddingCollectionAwaitable must look up here",
    "rectrain.distributed.test_utils.test_model": _FIXTURE,
    "rectrain.distributed.test_utils.multi_process": _FIXTURE,
    "rectrain.distributed.test_utils.model_input": _FIXTURE,
    "rectrain.schema.utils": "TorchRec's signature-compatibility rule, which has no engine counterpart",
    "rectrain.test_utils": _FIXTURE,
    "rectrain.datasets.test_utils.criteo_test_utils": _FIXTURE,
    "rectrain.datasets.criteo": _ENGINE_PACKAGE,
    "rectrain.datasets.movielens": _ENGINE_PACKAGE,
    "rectrain.datasets.random": _ENGINE_PACKAGE,
    "rectrain.datasets.utils": "code patches its helpers' lookups at this path (see its docstring)",
    "rectrain.distributed.model_tracker.delta_store": "TorchRec's per-batch store of ids with their first or "
    "last state; the engine's TouchedRows keeps ids only, as bitmaps",
    "rectrain.distributed.feature_score_utils": "TorchRec's feature-score rules of virtual-table eviction; "
    "no engine counterpart (rectrain runs no virtual table)",
    "rectrain.distributed.logger": "TorchRec's method logger and its per-call-site caps, which have no "
    "engine counterpart",
    "rectrain.inference.modules": "TorchRec's module swap (quantize_embeddings) onto recserve's quantized "
    "lookups: the only one, the kernels are recserve's",
    "rectrain.metrics.auc": _ENGINE_PACKAGE,
    "rectrain.metrics.metric_module": _ENGINE_PACKAGE,
    "rectrain.metrics.metrics_config": _ENGINE_PACKAGE,
    "rectrain.metrics.metrics_namespace": _ENGINE_PACKAGE,
    "rectrain.metrics.model_utils": _ENGINE_PACKAGE,
    "rectrain.metrics.mse": _ENGINE_PACKAGE,
    "rectrain.metrics.ne": _ENGINE_PACKAGE,
    "rectrain.metrics.rec_metric": _ENGINE_PACKAGE,
    "rectrain.metrics.throughput": _ENGINE_PACKAGE,
    "rectrain.metrics.test_utils": _FIXTURE,
    "rectrain.models.dlrm": _ENGINE_PACKAGE,
    "rectrain.modules.embedding_tower": "TorchRec's tower modules, which have no engine counterpart",
    "rectrain.modules.hash_mc_metrics": "TorchRec's tests patch time at this path",
    "rectrain.modules.utils": "TorchRec's helpers for users' models, which have no engine counterpart",
    "rectrain.optim.clipping": _ENGINE_PACKAGE,
    "rectrain.optim.fused": _ENGINE_PACKAGE,
    "rectrain.optim.keyed": _ENGINE_PACKAGE,
    "rectrain.optim.rowwise_adagrad": _ENGINE_PACKAGE,
    "rectrain.optim.semi_sync": "TorchRec's semi-sync wrapper of two keyed optimizers, no engine counterpart",
    "rectrain.optim.warmup": _ENGINE_PACKAGE,
    "rectrain.sparse.jagged_tensor_validator": "TorchRec's validator contract over rectrain's checks; "
    "not yet thinned (issue 44, sparse part)",
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def torchrec_path_modules(root: Path) -> dict[str, Path]:
    """rectrain's modules at a TorchRec 1.8.0 path, by dotted name."""
    found = {}
    for path in sorted((root / "rectrain").rglob("*.py")):
        name = _module_name(path, root)
        package, _, leaf = name.removeprefix("rectrain").lstrip(".").rpartition(".")
        if name == "rectrain" or leaf in TORCHREC_1_8.get(package, "").split():
            found[name] = path
    return found


def logic_lines(source: str) -> int:
    """Lines of top-level functions, classes and statements other than imports, assignments and docstrings."""
    thin = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.Expr, ast.Try)

    def is_thin(node: ast.stmt) -> bool:
        return isinstance(node, thin) or (
            isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        )

    return sum(node.end_lineno - node.lineno + 1 for node in ast.parse(source).body if not is_thin(node))


def test_modules_at_torchrec_paths_only_reexport_or_adapt():
    modules = torchrec_path_modules(ROOT)
    assert len(modules) > 60  # the walk found them
    heavy = {
        name: lines
        for name, path in modules.items()
        if (lines := logic_lines(path.read_text())) > BUDGET and name not in ALLOWED
    }
    assert not heavy, (
        f"modules at TorchRec paths with more than {BUDGET} lines of functions and classes (move the logic "
        f"to an engine package and re-export it, or add the module to ALLOWED with a reason): {heavy}"
    )


def test_the_allow_list_is_current():
    modules = torchrec_path_modules(ROOT)
    stale = [
        name for name in ALLOWED if name not in modules or logic_lines(modules[name].read_text()) <= BUDGET
    ]
    assert not stale, f"remove from ALLOWED (gone, not at a TorchRec path, or within the budget): {stale}"


def test_flat_distributed_modules_are_torchrec_paths():
    # The engine's distributed code lives in subpackages named for what it is (comm/, routing/, sharded/,
    # parallel/, interfaces/); a module directly in rectrain/distributed/ is at a TorchRec path.
    flat = sorted(p.stem for p in (ROOT / "rectrain" / "distributed").glob("*.py"))
    engine = [name for name in flat if name not in TORCHREC_1_8["distributed"].split()]
    assert not engine, f"move these into an engine subpackage of rectrain/distributed/: {engine}"


def test_the_measure(tmp_path):
    reexport = '"""Doc."""\nfrom a import b\nc = b.d\n__all__ = ["b"]\n'
    body = "\n".join(f"    x{i} = {i}" for i in range(50))
    assert logic_lines(reexport) == 0
    assert logic_lines(f"class A:\n{body}\n\n\ndef f():\n    return 1\n") == 53
    (tmp_path / "rectrain" / "distributed").mkdir(parents=True)
    for name in ("__init__", "comm_ops", "routing"):
        (tmp_path / "rectrain" / "distributed" / f"{name}.py").write_text("")
    (tmp_path / "rectrain" / "__init__.py").write_text("")
    assert sorted(torchrec_path_modules(tmp_path)) == [
        "rectrain",
        "rectrain.distributed",
        "rectrain.distributed.comm_ops",
    ]
