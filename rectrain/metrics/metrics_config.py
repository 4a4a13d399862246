"""What a ``RecMetricModule`` computes (TorchRec's ``metrics_config``): tasks, metrics, windows, modes.

``generate_metric_module`` builds the module from a ``MetricsConfig``; each ``RecMetricDef`` names the tasks
a metric runs on and its window (the job's window: each rank keeps ``window_size / world_size``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rectrain.metrics.metrics_namespace import StrValueMixin


class RecMetricEnumBase(StrValueMixin, Enum):
    pass


class RecMetricEnum(RecMetricEnumBase):
    NE = "ne"
    NE_POSITIVE = "ne_positive"
    RECALIBRATED_NE = "recalibrated_ne"
    RECALIBRATED_CALIBRATION = "recalibrated_calibration"
    SEGMENTED_NE = "segmented_ne"
    LOG_LOSS = "log_loss"
    CTR = "ctr"
    AUC = "auc"
    AUPRC = "auprc"
    RAUC = "rauc"
    CALIBRATION = "calibration"
    MSE = "mse"
    MAE = "mae"
    MULTICLASS_RECALL = "multiclass_recall"
    RECALL_SESSION_LEVEL = "recall_session_level"
    PRECISION_SESSION_LEVEL = "precision_session_level"
    WEIGHTED_AVG = "weighted_avg"
    TOWER_QPS = "tower_qps"
    ACCURACY = "accuracy"
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
    NMSE = "nmse"
    AVERAGE = "average"
    MULTI_LABEL_PRECISION = "multi_label_precision"
    NUM_POSITIVE_SAMPLES = "num_positive_samples"
    SUM_WEIGHTS = "sum_weights"
    NUM_MISSING_LABELS = "num_missing_labels"
    WEIGHTED_SUM_PREDICTIONS = "weighted_sum_predictions"


@dataclass(unsafe_hash=True, eq=True)
class SessionMetricDef:
    session_var_name: str
    top_threshold: int | None = None
    run_ranking_of_labels: bool = False


@dataclass(unsafe_hash=True, eq=True)
class RecTaskInfo:
    """One task of a model: the names of its label, prediction and weight in the model's output dict."""

    name: str = "DefaultTask"
    label_name: str = "label"
    prediction_name: str = "prediction"
    weight_name: str = "weight"
    session_metric_def: SessionMetricDef | None = None
    is_negative_task: bool = False
    tensor_name: str | None = None
    weighted: bool = True


class RecComputeMode(Enum):
    """How the tasks of one metric are computed: one computation per task (UNFUSED), or one for all of
    them with states of shape ``[n_tasks]`` (FUSED_TASKS; FUSED_TASKS_AND_STATES computes the same here)."""

    FUSED_TASKS_COMPUTATION = 1
    UNFUSED_TASKS_COMPUTATION = 2
    FUSED_TASKS_AND_STATES_COMPUTATION = 3


_DEFAULT_WINDOW_SIZE = 10_000_000
_DEFAULT_THROUGHPUT_WINDOW_SECONDS = 100
_DEFAULT_THROUGHPUT_WARMUP_STEPS = 100


@dataclass
class RecMetricDef:
    """One metric: its tasks (``rec_tasks``, or ``rec_task_indices`` into ``MetricsConfig.rec_tasks``), its
    global window in examples, and extra constructor ``arguments`` (e.g. ``{"include_logloss": True}``)."""

    rec_tasks: list[RecTaskInfo] = field(default_factory=list)
    rec_task_indices: list[int] = field(default_factory=list)
    window_size: int = _DEFAULT_WINDOW_SIZE
    arguments: dict[str, Any] | None = None


class StateMetricEnum(StrValueMixin, Enum):
    OPTIMIZERS = "optimizers"
    MODEL_CONFIGURATOR = "model_configurator"


@dataclass
class ThroughputDef:
    window_size: int = _DEFAULT_THROUGHPUT_WINDOW_SECONDS
    warmup_steps: int = _DEFAULT_THROUGHPUT_WARMUP_STEPS


@dataclass
class MetricsConfig:
    """Everything ``generate_metric_module`` needs; fields as TorchRec's (``compute_interval_steps``: how many
    batches between ``should_compute()`` being true)."""

    rec_tasks: list[RecTaskInfo] = field(default_factory=list)
    rec_metrics: dict[RecMetricEnum, RecMetricDef] = field(default_factory=dict)
    throughput_metric: ThroughputDef | None = None
    rec_compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION
    fused_update_limit: int = 0
    state_metrics: list[StateMetricEnum] = field(default_factory=list)
    compute_interval_steps: int = 100
    min_compute_interval: float = 0.0
    max_compute_interval: float = float("inf")
    compute_on_all_ranks: bool = False
    should_validate_update: bool = False
    enable_pt2_compile: bool = False
    should_clone_update_inputs: bool = False
    use_cpu_offloaded_rec_metric_module: bool | None = None

    def __post_init__(self) -> None:
        for metric, definition in self.rec_metrics.items():
            for index in definition.rec_task_indices:
                if self.rec_tasks is None:
                    raise ValueError(
                        f"rec_task_indices {definition.rec_task_indices} is specified, "
                        f"but rec_tasks is None for metric {metric}"
                    )
                if index >= len(self.rec_tasks):
                    raise ValueError(
                        f"rec_task_indices {index} is out of range of {len(self.rec_tasks)} tasks "
                        f"for metric {metric}"
                    )


DefaultTaskInfo = RecTaskInfo()

DefaultMetricsConfig = MetricsConfig(
    rec_tasks=[DefaultTaskInfo],
    rec_metrics={
        RecMetricEnum.NE: RecMetricDef(rec_tasks=[DefaultTaskInfo], window_size=_DEFAULT_WINDOW_SIZE)
    },
    throughput_metric=ThroughputDef(),
)

EmptyMetricsConfig = MetricsConfig()


@dataclass
class BatchSizeStage:
    """A stage of a variable batch size: ``batch_size`` until iteration ``max_iters`` (None: the last)."""

    batch_size: int = 0
    max_iters: int | None = 0


def validate_batch_size_stages(batch_size_stages: list[BatchSizeStage] | None) -> None:
    if batch_size_stages and batch_size_stages[-1].max_iters is not None:
        raise ValueError(
            "Batch size stages last stage should have max_iters = None, "
            f"but get {batch_size_stages[-1].max_iters}"
        )
