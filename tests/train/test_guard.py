"""The divergence guard: a NaN loss or an AUC collapse stops the run, names the step, keeps the last save."""

from __future__ import annotations

import pytest
import torch

from rectrain.errors import TrainingDiverged
from rectrain.train.guard import DivergenceGuard
from rectrain.train.job import TrainJob
from rectrain.train.sync import RankAgreement
from tests.train.test_job import events, synthetic


def test_a_huge_learning_rate_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    huge = ("optimizer.dense=sgd", "optimizer.dense_lr=300.0", "train.steps=40", "checkpoint.every_n_steps=2")
    with pytest.raises(TrainingDiverged) as caught:
        TrainJob(synthetic(tmp_path, *huge), progress_bar=False).run()  # blows up after a few steps
    message = str(caught.value)
    assert message.startswith("training diverged at step ") and "\n" not in message
    step = int(message.split("at step ")[1].split(":")[0])
    saved = [e["step"] for e in events(tmp_path / "metrics.jsonl") if e["event"] == "checkpoint"]
    assert saved and max(saved) < step < 40
    assert f"the last good checkpoint (step {max(saved)}) is kept. Fix: lower optimizer.sparse_lr" in message
    resumed = TrainJob(synthetic(tmp_path, "optimizer.dense=sgd", "train.steps=1"), progress_bar=False)
    try:
        assert resumed.run().start.step == max(saved)
    except TrainingDiverged as again:  # the saved state's loss was finite, its predictions may be far off
        message = str(again)
        assert f"at step {max(saved)}: held-out AUC is" in message and "worse than predicting" in message


def test_a_nan_loss_raises_and_a_finite_one_does_not():
    guard = DivergenceGuard(RankAgreement(None), last_good_step=40)
    guard.check_loss(41, torch.tensor(0.69))
    with pytest.raises(
        TrainingDiverged, match=r"at step 42: training loss is nan; the last good checkpoint \(step 40\)"
    ):
        guard.check_loss(42, torch.tensor(float("nan")))


def test_an_undefined_auc_only_warns_but_nan_predictions_raise(caplog):
    guard = DivergenceGuard(RankAgreement(None), last_good_step=4)
    nan = float("nan")
    guard.check_eval(4, {"auc": nan, "num_examples": 0, "log_loss": nan})  # an empty held-out split
    guard.check_eval(4, {"auc": nan, "num_examples": 32, "log_loss": 0.4})  # one class of labels
    assert "no held-out rows" in caplog.text and "labels are all one class" in caplog.text
    with pytest.raises(TrainingDiverged, match="at step 5: held-out AUC is nan"):
        guard.check_eval(5, {"auc": nan, "num_examples": 32, "log_loss": nan})


def test_an_auc_collapse_after_learning_raises_but_chance_from_the_start_only_warns(caplog):
    never_learned = DivergenceGuard(RankAgreement(None))
    for step, auc in [(10, 0.50), (20, 0.502), (30, 0.499)]:
        never_learned.check_eval(step, {"auc": auc})
    assert "held-out AUC is 0.4990 at step 30: the model is not learning" in caplog.text
    guard = DivergenceGuard(RankAgreement(None))
    guard.check_eval(10, {"auc": 0.62})
    guard.check_eval(20, {"auc": 0.58})  # worse, but still learning: not a collapse
    with pytest.raises(
        TrainingDiverged, match=r"at step 30: held-out AUC collapsed to 0.5010 \(it was 0.6200\)"
    ):
        guard.check_eval(30, {"auc": 0.501})


def test_chance_auc_with_confidently_wrong_predictions_raises_from_the_start():
    guard = DivergenceGuard(RankAgreement(None))
    guard.check_eval(10, {"auc": 0.501, "ne": 1.02})  # no signal found yet: a warning, not a stop
    with pytest.raises(
        TrainingDiverged, match=r"at step 20: held-out AUC is 0.4990 and NE 7.30 \(worse than"
    ) as caught:
        guard.check_eval(20, {"auc": 0.499, "ne": 7.3})
    assert "\n" not in str(caught.value) and "Fix: lower optimizer.sparse_lr" in str(caught.value)


def test_a_deferred_loss_check_names_the_first_bad_step_when_it_settles():
    """On a GPU the guard keeps each loss's finiteness on the device and reads them all at once."""
    guard = DivergenceGuard(RankAgreement(None), last_good_step=40)
    guard.deferred = True
    guard.check_loss(41, torch.tensor(0.69), settle=False)
    guard.check_loss(42, torch.tensor(float("nan")), settle=False)
    guard.check_loss(43, torch.tensor(float("inf")), settle=False)  # nothing read yet: no raise
    with pytest.raises(TrainingDiverged, match=r"at step 42: training loss is not finite; the last good"):
        guard.settle()
    guard.check_loss(44, torch.tensor(0.5), settle=True)  # settled and finite
    guard.settle()  # nothing unread: a no-op
