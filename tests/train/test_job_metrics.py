"""The job's reported AUC and NE are ``RecMetricModule``'s on the same predictions (one metrics engine)."""

from __future__ import annotations

import pytest
import torch

from rectrain.metrics.metric_module import RecMetricModule, generate_metric_module
from rectrain.metrics.metrics_config import DefaultTaskInfo, MetricsConfig, RecMetricDef, RecMetricEnum
from rectrain.train.job import TrainJob
from tests.train.test_job import events, synthetic


def _metric_module() -> RecMetricModule:
    whole_pass = 10**9  # AUC over every held-out example, as the job's evaluation
    config = MetricsConfig(
        rec_tasks=[DefaultTaskInfo],
        rec_metrics={
            RecMetricEnum.AUC: RecMetricDef(rec_tasks=[DefaultTaskInfo], window_size=whole_pass),
            RecMetricEnum.NE: RecMetricDef(rec_tasks=[DefaultTaskInfo], arguments={"include_logloss": True}),
            RecMetricEnum.CALIBRATION: RecMetricDef(rec_tasks=[DefaultTaskInfo]),
        },
    )
    return generate_metric_module(RecMetricModule, config, 64, 1, 0, {}, torch.device("cpu"))


def test_the_jobs_auc_and_ne_are_the_metric_modules_on_the_same_predictions(tmp_path):
    job = TrainJob(synthetic(tmp_path, "train.steps=10", "train.eval_every=0"), progress_bar=False)
    job.run()
    (reported,) = [e for e in events(tmp_path / "metrics.jsonl") if e["event"] == "eval"]

    module = _metric_module()
    model = job.training.prediction_model.eval()
    with torch.no_grad():
        for batch in job.data.eval_batches():
            logits = model(batch.dense_features, batch.sparse_features).reshape(-1)
            probabilities = torch.sigmoid(logits.float())
            labels = batch.labels.reshape(-1).float()
            module.update({"prediction": probabilities, "label": labels, "weight": torch.ones_like(labels)})
    values = {key: float(value) for key, value in module.compute().items()}

    assert reported["num_examples"] == 4 * 64
    assert reported["auc"] == pytest.approx(values["auc-DefaultTask|window_auc"], rel=1e-12)
    assert reported["ne"] == pytest.approx(values["ne-DefaultTask|lifetime_ne"], rel=1e-12)
    calibration = values[
        "calibration-DefaultTask|lifetime_calibration"
    ]  # float32 products here, float64 there
    assert reported["calibration"] == pytest.approx(calibration, rel=1e-6)
    # the log's log loss is in nats, TorchRec's in bits
    assert reported["log_loss"] == pytest.approx(
        values["ne-DefaultTask|lifetime_logloss"] * 0.6931471805599453
    )
    assert 0.5 < reported["auc"] < 1.0
