"""Accuracy report at export: quantized model vs the fp32 model on a held-out sample.

Per variant (the package's own dtypes, and every uniform table dtype for comparison): max and mean absolute
logit difference against fp32, and the AUC of both. Without labels from the data, labels are drawn as
Bernoulli(sigmoid(fp32 logit)) with a fixed seed, so the fp32 AUC is what a perfectly calibrated model gets
and the AUC difference measures how much ranking quality quantization costs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from recserve.export.quantize import quantize_table
from recserve.runtime.layout import QuantizedTable, TableDType
from recserve.runtime.placement import ServingPlacement
from recserve.runtime.predictor import Predictor, metadata_for
from recserve.runtime.quant_embedding import split_by_placement
from rectrain.metrics import auc
from rectrain.models import build_model
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

logger = logging.getLogger(__name__)

_BATCH = 1024  # examples per forward, to bound memory on large samples


@dataclass
class AccuracySample:
    """Held-out examples: ``dense [N, W]``, ``kjt`` (stride N), optional ``labels [N]`` in {0, 1}."""

    dense: Tensor
    kjt: KeyedJaggedTensor
    labels: Tensor | None = None


def synthetic_sample(
    cfg: ModelConfig, num_examples: int = 4096, ids_per_feature: tuple[int, int] = (1, 10), seed: int = 0
) -> AccuracySample:
    """Examples shaped by ``cfg``: standard-normal dense features, uniform ids over each feature's table."""
    gen = torch.Generator().manual_seed(seed)
    rows: dict[str, int] = {}
    for table in cfg.tables:
        for feature in table.feature_names:
            rows[feature] = min(rows.get(feature, table.num_embeddings), table.num_embeddings)
    lo, hi = ids_per_feature
    lengths = torch.randint(lo, hi + 1, (len(rows) * num_examples,), generator=gen)
    counts = lengths.view(len(rows), num_examples).sum(1).tolist()
    values = torch.cat(
        [torch.randint(0, limit, (count,), generator=gen) for limit, count in zip(rows.values(), counts)]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=list(rows), values=values, lengths=lengths)
    dense = torch.randn(num_examples, cfg.dense_in_features, generator=gen)
    return AccuracySample(dense, kjt)


def _batched_logits(forward: Any, sample: AccuracySample) -> Tensor:
    n = sample.dense.shape[0]
    chunks = []
    for start in range(0, n, _BATCH):
        end = min(n, start + _BATCH)
        kjt = _slice_kjt(sample.kjt, start, end)
        chunks.append(forward(sample.dense[start:end], kjt).reshape(-1).float())
    return torch.cat(chunks)


def _slice_kjt(kjt: KeyedJaggedTensor, start: int, end: int) -> KeyedJaggedTensor:
    """Examples ``[start, end)`` of every key."""
    if start == 0 and end == kjt.stride():
        return kjt
    lengths = kjt.lengths().view(len(kjt.keys()), -1)
    offsets = kjt.offsets()
    stride = kjt.stride()
    pieces = [
        kjt.values()[offsets[k * stride + start] : offsets[k * stride + end]] for k in range(len(kjt.keys()))
    ]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=kjt.keys(), values=torch.cat(pieces), lengths=lengths[:, start:end].reshape(-1)
    )


def _fp32_model(cfg: ModelConfig, state_dict: Mapping[str, Tensor]) -> nn.Module:
    model = build_model(cfg)
    model.load_state_dict(dict(state_dict), strict=True)
    return model.eval()


def _compare(reference: Tensor, logits: Tensor, labels: Tensor, reference_auc: float) -> dict[str, float]:
    diff = (logits - reference).abs()
    quantized_auc = auc(torch.sigmoid(logits), labels)
    return {
        "max_abs_logit_diff": float(diff.max()),
        "mean_abs_logit_diff": float(diff.mean()),
        "auc": quantized_auc,
        "auc_diff": quantized_auc - reference_auc,
    }


def accuracy_report(
    cfg: ModelConfig,
    state_dict: Mapping[str, Tensor],
    table_weights: Mapping[str, Tensor],
    quantized: Mapping[str, QuantizedTable],
    placement: ServingPlacement,
    dense_state: Mapping[str, Tensor],
    dense_dtype: str,
    *,
    sample: AccuracySample | None = None,
    compare_dtypes: tuple[str, ...] = ("fp16", "int8", "int4", "int2"),
) -> dict[str, Any]:
    """The report stored in the manifest's ``accuracy``: ``package`` (the exported tables) and ``by_dtype``.

    ``state_dict`` is the fp32 prediction module's; ``table_weights`` its tables by name (for the uniform
    dtypes of ``compare_dtypes``); ``quantized``, ``placement`` and ``dense_state`` are the package's.
    """
    sample = sample or synthetic_sample(cfg)
    with torch.no_grad():
        reference = _batched_logits(_fp32_model(cfg, state_dict), sample)
    labels = sample.labels
    label_source = "data"
    if labels is None:
        gen = torch.Generator().manual_seed(1)
        labels = torch.bernoulli(torch.sigmoid(reference), generator=gen)
        label_source = "bernoulli(sigmoid(fp32 logit))"
        if labels.min() == labels.max():
            # A barely trained model can score every example far to one side, and AUC needs both classes;
            # ranking against the fp32 model's own median still measures what quantization does to the order.
            labels = (reference.reshape(-1) > reference.median()).to(labels.dtype).reshape(labels.shape)
            label_source = "fp32 logit above its median (sampled labels were all one class)"
    reference_auc = auc(torch.sigmoid(reference), labels)
    report: dict[str, Any] = {
        "sample": {"examples": int(sample.dense.shape[0]), "labels": label_source},
        "fp32_auc": reference_auc,
        "dense_dtype": dense_dtype,
    }
    variants: dict[str, Mapping[str, QuantizedTable]] = {"package": quantized}
    for name in compare_dtypes:
        dtype = TableDType.parse(name)
        variants[name] = {table: quantize_table(weight, dtype) for table, weight in table_weights.items()}
    by_dtype = {}
    for name, tables in variants.items():
        predictor = Predictor.build(
            cfg,
            split_by_placement(tables, placement),
            placement,
            dense_state,
            metadata=metadata_for(cfg, {}),
            dense_dtype=dense_dtype,
        )
        result = _compare(reference, _batched_logits(predictor.predict_logits, sample), labels, reference_auc)
        if name == "package":
            report["package"] = result
        else:
            by_dtype[name] = result
    report["by_dtype"] = by_dtype
    if dense_dtype == "fp32":  # what serving may run instead where the CPU has native bf16 (dense_precision)
        predictor = Predictor.build(
            cfg,
            split_by_placement(quantized, placement),
            placement,
            dense_state,
            metadata=metadata_for(cfg, {}),
            dense_dtype="bf16",
        )
        logits = _batched_logits(predictor.predict_logits, sample)
        report["dense_bf16"] = _compare(reference, logits, labels, reference_auc)
    return report
