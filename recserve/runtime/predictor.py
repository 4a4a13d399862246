"""``Predictor``: a loaded model package that scores batches in process.

    predictor = Predictor.load("pkg/")            # verifies checksums, builds kernels and the dense part
    scores = predictor.predict(dense, kjt)        # [B] float32, sigmoid of the logits
    predictor.apply_delta(read_delta(...))        # a model delta (recserve.runtime.delta): version "N.SEQ"

``predict`` may be called from several threads at once: it runs under ``torch.inference_mode`` and the model
keeps no per-call state (the FBGEMM int-N kernels read their weights only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from recserve.errors import PackageError
from recserve.runtime.assembly import build_skeleton, compile_dense_part, replace_module
from recserve.runtime.delta import Delta, manifest_sha256
from recserve.runtime.delta_apply import StreamPosition, check_rows, copy_dense, prepare_dense
from recserve.runtime.dense_bounds import DenseBounds
from recserve.runtime.dense_precision import DENSE_DTYPES, choose_dense_dtype
from recserve.runtime.layout import QuantizedTable
from recserve.runtime.package import (
    DENSE_FILE,
    MANIFEST_FILE,
    load_dense,
    load_remaps,
    load_shards,
    read_manifest,
    verify_files,
)
from recserve.runtime.package_checks import check_manifest
from recserve.runtime.placement import ServingPlacement, TableShard
from recserve.runtime.quant_embedding import QuantEmbeddingBagCollection
from recserve.runtime.serving_graph import ServingGraph, build_serving_graph
from recserve.runtime.staging import Staging
from recserve.runtime.validation import RequestValidator
from rectrain.errors import ConfigError
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackageMetadata:
    """What a client needs to know to build requests, and what the server reports."""

    model_name: str
    version: str
    feature_names: list[str]
    dense_in_features: int
    num_embeddings: dict[str, int]  # per feature: ids must lie in [0, n)
    weighted_features: list[str]
    table_dtypes: dict[str, str]
    dense_bounds: DenseBounds | None = None  # what the server accepts of dense inputs (None: any finite)


def metadata_for(
    cfg: ModelConfig, table_dtypes: Mapping[str, str], model_name: str = "model", version: str = "1"
) -> PackageMetadata:
    """The metadata of a model of ``cfg`` with tables stored as ``table_dtypes``."""
    rows: dict[str, int] = {}
    for table in cfg.tables:
        for feature in table.feature_names:
            # A feature read by several tables must be valid for each: its limit is the smallest table.
            rows[feature] = min(rows.get(feature, table.num_embeddings), table.num_embeddings)
    features = list(rows)
    return PackageMetadata(
        model_name=model_name,
        version=version,
        feature_names=features,
        dense_in_features=cfg.dense_in_features,
        num_embeddings={f: rows[f] for f in features},
        weighted_features=[],
        table_dtypes=dict(table_dtypes),
    )


@dataclass(frozen=True)
class PreparedDelta:
    """A delta made ready to serve (``Predictor.prepare_delta``) on top of version ``prepared_at``."""

    prepared_at: StreamPosition
    position: StreamPosition
    overlays: list
    dense: list[tuple[Tensor, Tensor]]
    num_rows: int
    seconds: float


class Predictor:
    """A serving model: quantized lookups on their devices plus the dense part, behind ``predict``."""

    def __init__(
        self,
        model: nn.Module,
        metadata: PackageMetadata,
        device: torch.device,
        dtype: torch.dtype,
        graph: ServingGraph | None = None,
        *,
        position: StreamPosition | None = None,
    ):
        self.model = model
        self.graph = graph  # the model's forward as one TorchScript call, when it could be built and checked
        self._metadata = metadata
        self.device = device
        self.dtype = dtype
        self._validator = RequestValidator(metadata.dense_in_features, metadata.num_embeddings)
        # On a GPU a checked batch travels in one asynchronous copy through reused pinned memory.
        self._staging = Staging(device) if device.type == "cuda" else None
        self._lookups = next(m for m in model.modules() if isinstance(m, QuantEmbeddingBagCollection))
        self._position = position or StreamPosition(metadata.version, metadata.model_name)

    @property
    def lookups(self) -> QuantEmbeddingBagCollection:
        """The quantized lookups (the dense part runs after them: ``graph.after_lookups``)."""
        return self._lookups

    @property
    def metadata(self) -> PackageMetadata:
        """The base package's metadata (deltas change weights only; ``model_version`` names the deltas)."""
        return self._metadata

    @property
    def model_version(self) -> str:
        """``"N"`` when serving base package N, ``"N.SEQ"`` after its deltas 1..SEQ."""
        return self._position.version

    @property
    def model_step(self) -> int | None:
        """The training step of the newest applied delta, else the base's (its manifest's ``source.step``)."""
        return self._position.step

    @property
    def wall_time(self) -> float | None:
        """When the newest applied delta's rows were read (unix seconds), else the base's
        ``source.wall_time``."""
        return self._position.wall_time

    @property
    def overlay_bytes(self) -> int:
        """Memory this predictor holds for rows changed by deltas, over the shared base rows."""
        return self._lookups.overlay_bytes

    def apply_delta(self, delta: Delta) -> None:
        """Serve ``delta`` (from ``read_delta``) on top of what is served: ``commit(prepare_delta(delta))``.
        PackageError, with nothing changed, unless it is the next delta of this base and fits this model.
        Callers run no predict at the same time."""
        self.commit(self.prepare_delta(delta))

    def prepare_delta(self, delta: Delta) -> PreparedDelta:
        """Everything applying ``delta`` takes, done beside serving: checks, the kernels' next overlays
        (changed rows written and indexed), the dense values converted. Nothing served changes; ``commit``
        swaps it in. PackageError unless it is the next delta of this base and fits this model.

        Predicts may run meanwhile; only one delta is prepared at a time (the follower's thread)."""
        started = time.perf_counter()
        position = self._position.after(delta)
        check_rows(self._lookups.embedding_bag_configs(), delta)
        dense = prepare_dense(self.model, delta)
        overlays = self._lookups.overlays_with(delta.rows)
        return PreparedDelta(
            self._position, position, overlays, dense, delta.num_rows, time.perf_counter() - started
        )

    def commit(self, prepared: PreparedDelta) -> list:
        """Serve a prepared delta from the next batch on: a few assignments and the dense copy (which a
        traced graph shares), nothing that can fail. Callers run no predict at the same time. Returns what
        it replaced, for the caller to drop off the batch path (freeing a large overlay takes time)."""
        if prepared.prepared_at != self._position:
            raise PackageError(
                f"delta {prepared.position.sequence} was prepared on version "
                f"{prepared.prepared_at.version}, but {self.model_version} is served"
            )
        replaced = self._lookups.use_overlays(prepared.overlays)
        copy_dense(prepared.dense)
        self._position = prepared.position
        logger.info(
            "applied delta %d of %s version %s (%d rows, step %s; prepared in %.3f s); overlay %.1f MB",
            prepared.position.sequence,
            self._metadata.model_name,
            prepared.position.base_version,
            prepared.num_rows,
            prepared.position.step,
            prepared.seconds,
            self.overlay_bytes / 1e6,
        )
        return replaced

    @classmethod
    def build(
        cls,
        cfg: ModelConfig,
        shards: Mapping[TableShard, QuantizedTable],
        placement: ServingPlacement,
        dense_state: Mapping[str, Tensor],
        *,
        metadata: PackageMetadata,
        dense_dtype: str = "fp32",
        device: torch.device | str = "cpu",
        compile_dense: bool = False,
        remaps: Mapping[TableShard, Tensor] | None = None,
    ) -> Predictor:
        """Assemble a predictor from parts in memory (what ``load`` reads from a package); ``remaps``: the
        index remaps of a pruned package's shards (``recserve.runtime.pruning``).

        ``compile_dense`` runs the dense layers through ``torch.compile`` (first batches take seconds to
        compile; see the benchmark for whether it pays on your hardware).
        """
        device = torch.device(device)
        dtype = DENSE_DTYPES[dense_dtype]
        model, ebc_path = build_skeleton(cfg, device)
        lookups = QuantEmbeddingBagCollection(
            cfg.tables,
            shards,
            placement,
            device=device,
            output_dtype=dtype,
            bounds_check=False,
            remaps=remaps,
        )
        replace_module(model, ebc_path, lookups)
        model.load_state_dict(dict(dense_state), strict=True)
        model.to(dtype).eval()
        if compile_dense:
            logger.info("compiled dense modules %s", compile_dense_part(model, ebc_path))
            return cls(model, metadata, device, dtype)
        graph = build_serving_graph(
            model, ebc_path, metadata.dense_in_features, metadata.num_embeddings, dtype
        )
        return cls(model, metadata, device, dtype, graph)

    @classmethod
    def load(
        cls,
        package_dir: str | Path,
        device: torch.device | str = "cpu",
        *,
        verify: bool = True,
        compile_dense: bool = False,
        dense_dtype: str | None = None,
    ) -> Predictor:
        """Load a package: check every file's sha256 (unless ``verify=False``), then build the model.

        ``dense_dtype`` (auto, fp32, bf16; None: ``$RECSERVE_DENSE_DTYPE``, else auto): an fp32 dense part
        runs in bf16 where the CPU has native bf16 and the package's accuracy gate allows it
        (:mod:`recserve.runtime.dense_precision`); the choice is logged.

        ``device`` runs the dense part and every lookup device of the package's placement whose type
        differs (a package exported for several GPUs also loads on one CPU). Raises ``PackageError`` naming
        the file that is missing, corrupt or inconsistent.
        """
        started = time.perf_counter()
        manifest = read_manifest(package_dir)
        if verify:
            verify_files(package_dir, manifest)
        where = f"{Path(package_dir) / MANIFEST_FILE}: model_config"
        try:
            cfg = ModelConfig.from_dict(manifest.model_config, where=where)
        except ConfigError as error:
            raise PackageError(str(error)) from None
        if manifest.dense_dtype not in DENSE_DTYPES:
            raise PackageError(
                f"{where}: dense_dtype {manifest.dense_dtype!r} is not one of {list(DENSE_DTYPES)}"
            )
        check_manifest(manifest, cfg, str(Path(package_dir) / MANIFEST_FILE))
        metadata = metadata_for(
            cfg, {t.name: t.dtype.value for t in manifest.tables}, manifest.model_name, manifest.version
        )
        bounds = DenseBounds.parse(
            manifest.dense_bounds, manifest.dense_in_features, str(Path(package_dir) / MANIFEST_FILE)
        )
        metadata = replace(metadata, dense_bounds=bounds)
        source = manifest.source or {}
        position = StreamPosition(
            manifest.version,
            manifest.model_name,
            manifest_sha256(package_dir),
            step=source.get("step"),
            wall_time=source.get("wall_time"),
        )
        shards = load_shards(package_dir, manifest)
        chosen, why = choose_dense_dtype(
            manifest.dense_dtype, manifest.accuracy, torch.device(device).type, dense_dtype
        )
        try:
            predictor = cls.build(
                cfg,
                shards,
                manifest.placement,
                load_dense(package_dir),
                metadata=metadata,
                dense_dtype=chosen,
                device=device,
                compile_dense=compile_dense,
                remaps=load_remaps(package_dir, manifest),
            )
            predictor._position = position
        except RuntimeError as error:  # load_state_dict: keys or shapes that do not fit the config
            raise PackageError(
                f"{Path(package_dir) / DENSE_FILE}: does not fit model_config ({error})"
            ) from None
        logger.info(
            "loaded %s version %s from %s in %.2f s; dense part in %s (%s)",
            manifest.model_name,
            manifest.version,
            package_dir,
            time.perf_counter() - started,
            chosen,
            why,
        )
        return predictor

    def predict_logits(self, dense: Tensor, kjt: KeyedJaggedTensor, *, checked: bool = False) -> Tensor:
        """Logits ``[B]`` float32 on CPU; InvalidRequestError on a malformed batch.

        The kernels do not bounds-check ids, so every check that keeps them in bounds (jagged structure,
        ids inside their tables, weights and dense shapes) runs whatever ``checked`` says, and the kernels
        read a KJT rebuilt from the checked offsets. ``checked=True`` (a caller such as the server that has
        checked each request) skips only what is not about memory safety: dense values being finite.
        """
        batch, kjt = self._validator.safe_batch(dense, kjt, checked=checked)
        if batch == 0:
            return torch.empty(0)
        with torch.inference_mode():
            forward = self.model if self.graph is None else self.graph
            if self._staging is not None and not dense.is_cuda:
                dense, kjt = self._staging.to_device(dense, kjt)
            logits = forward(dense.to(self.device, self.dtype), kjt)
            return logits.reshape(batch).float().cpu()

    def predict(self, dense: Tensor, kjt: KeyedJaggedTensor, *, checked: bool = False) -> Tensor:
        """Scores ``[B]`` float32 on CPU: the sigmoid of the logits (``checked`` as in ``predict_logits``)."""
        return torch.sigmoid(self.predict_logits(dense, kjt, checked=checked))
