"""Metric keys, TorchRec's scheme: ``f"{namespace}-{task_name}|{prefix}{metric_name}"`` (e.g.
``ne-DefaultTask|window_ne``), so dashboards and code that read TorchRec's keys read ours."""

from __future__ import annotations

from enum import Enum


class StrValueMixin:
    def __str__(self) -> str:
        return self.value  # type: ignore[attr-defined]


class MetricNameBase(StrValueMixin, Enum):
    pass


class MetricName(MetricNameBase):
    DEFAULT = ""
    NE = "ne"
    NE_POSITIVE = "ne_positive"
    SEGMENTED_NE = "segmented_ne"
    LOG_LOSS = "logloss"
    THROUGHPUT = "throughput"
    TOTAL_EXAMPLES = "total_examples"
    ATTEMPT_EXAMPLES = "attempt_examples"
    BATCH_SIZE = "batch_size"
    CTR = "ctr"
    CALIBRATION = "calibration"
    MSE = "mse"
    MAE = "mae"
    RMSE = "rmse"
    R_SQUARED = "r_squared"
    AUC = "auc"
    GAUC = "gauc"
    AUPRC = "auprc"
    RAUC = "rauc"
    GROUPED_AUC = "grouped_auc"
    GROUPED_AUPRC = "grouped_auprc"
    GROUPED_RAUC = "grouped_rauc"
    RECALL_SESSION_LEVEL = "recall_session_level"
    PRECISION_SESSION_LEVEL = "precision_session_level"
    MULTICLASS_RECALL = "multiclass_recall"
    MULTI_LABEL_PRECISION = "multi_label_precision"
    WEIGHTED_AVG = "weighted_avg"
    TOWER_QPS = "qps"
    ACCURACY = "accuracy"
    NDCG = "ndcg"
    XAUC = "xauc"
    SCALAR = "scalar"
    OUTPUT = "output"
    GAUC_NUM_SAMPLES = "gauc_num_samples"
    TOTAL_POSITIVE_EXAMPLES = "total_positive_examples"
    TOTAL_NEGATIVE_EXAMPLES = "total_negative_examples"
    PRECISION = "precision"
    RECALL = "recall"
    SERVING_NE = "serving_ne"
    SERVING_CALIBRATION = "serving_calibration"
    SERVING_AE_LOSS = "serving_ae_loss"
    TENSOR_WEIGHTED_AVG = "tensor_weighted_avg"
    CALI_FREE_NE = "cali_free_ne"
    UNWEIGHTED_NE = "unweighted_ne"
    HINDSIGHT_TARGET_PR = "hindsight_target_pr"
    HINDSIGHT_TARGET_PRECISION = "hindsight_target_precision"
    HINDSIGHT_TARGET_RECALL = "hindsight_target_recall"
    EFFECTIVE_SAMPLE_RATE = "effective_sample_rate"
    NMSE = "nmse"
    NRMSE = "nrmse"
    DATA_LABEL_AVERAGE = "data_label_average"
    LABEL_AVERAGE = "label_average"
    PREDICTION_AVERAGE = "prediction_average"
    NUM_POSITIVE_SAMPLES = "num_positive_samples"
    SUM_WEIGHTS = "sum_weights"
    NUM_MISSING_LABELS = "num_missing_labels"
    WEIGHTED_SUM_PREDICTIONS = "weighted_sum_predictions"


class MetricNamespaceBase(StrValueMixin, Enum):
    pass


class MetricNamespace(MetricNamespaceBase):
    DEFAULT = ""
    NE = "ne"
    NE_POSITIVE = "ne_positive"
    SEGMENTED_NE = "segmented_ne"
    RECALIBRATED_NE = "recalibrated_ne"
    RECALIBRATED_CALIBRATION = "recalibrated_calibration"
    THROUGHPUT = "throughput"
    CTR = "ctr"
    CALIBRATION = "calibration"
    MSE = "mse"
    AUC = "auc"
    GAUC = "gauc"
    AUPRC = "auprc"
    RAUC = "rauc"
    MAE = "mae"
    ACCURACY = "accuracy"
    OPTIMIZERS = "optimizers"
    MODEL_CONFIGURATOR = "model_configurator"
    MULTICLASS_RECALL = "multiclass_recall"
    MULTI_LABEL_PRECISION = "multi_label_precision"
    WEIGHTED_AVG = "weighted_avg"
    RECALL_SESSION_LEVEL = "recall_session_level"
    PRECISION_SESSION_LEVEL = "precision_session_level"
    TOWER_QPS = "qps"
    NDCG = "ndcg"
    XAUC = "xauc"
    SCALAR = "scalar"
    PRECISION = "precision"
    RECALL = "recall"
    SERVING_NE = "serving_ne"
    SERVING_CALIBRATION = "serving_calibration"
    SERVING_AE_LOSS = "serving_ae_loss"
    OUTPUT = "output"
    TENSOR_WEIGHTED_AVG = "tensor_weighted_avg"
    CALI_FREE_NE = "cali_free_ne"
    UNWEIGHTED_NE = "unweighted_ne"
    HINDSIGHT_TARGET_PR = "hindsight_target_pr"
    EFFECTIVE_RATE = "effective_rate"
    NMSE = "nmse"
    AVERAGE = "average"
    NUM_POSITIVE_SAMPLES = "num_positive_samples"
    SUM_WEIGHTS = "sum_weights"
    NUM_MISSING_LABELS = "num_missing_labels"
    WEIGHTED_SUM_PREDICTIONS = "weighted_sum_predictions"


class MetricPrefix(StrValueMixin, Enum):
    DEFAULT = ""
    LIFETIME = "lifetime_"
    WINDOW = "window_"
    ATTEMPT = "attempt_"


def task_wildcard_metrics_pattern(
    namespace: MetricNamespaceBase,
    metric_name: MetricNameBase,
    metric_prefix: MetricPrefix = MetricPrefix.DEFAULT,
) -> str:
    """A regular expression matching ``metric_name`` of every task in ``namespace``."""
    return rf"{namespace}-.+\|{metric_prefix}{metric_name}"


def compose_metric_namespace(namespace: MetricNamespaceBase, task_name: str) -> str:
    return f"{namespace}-{task_name}"


def compose_customized_metric_key(namespace: str, metric_name: str, description: str | None = None) -> str:
    return f"{namespace}|{metric_name}{description or ''}"


def compose_metric_key(
    namespace: MetricNamespaceBase,
    task_name: str,
    metric_name: MetricNameBase,
    metric_prefix: MetricPrefix = MetricPrefix.DEFAULT,
    description: str | None = None,
) -> str:
    """The key of one metric value: ``f"{namespace}-{task_name}|{metric_prefix}{metric_name}"``."""
    return compose_customized_metric_key(
        compose_metric_namespace(namespace, task_name), f"{metric_prefix}{metric_name}", description
    )
