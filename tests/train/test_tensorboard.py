"""``train.tensorboard_dir``: the metrics log's numbers also go to TensorBoard (the JSON-lines log stays the
record), a resumed run hides what a failed attempt logged past its checkpoint, and a missing ``tensorboard``
package is one line before the first step."""

from __future__ import annotations

import builtins
import sys

import pytest

from rectrain.cli import main
from rectrain.errors import ConfigError
from rectrain.train.job import TrainJob
from rectrain.train.tensorboard import TensorBoardLog
from tests.train.test_job import events, synthetic
from tests.train.test_preflight import SYNTHETIC, _one_line_error

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="the tensorboard package (test extra)"
)


def _scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for ``directory``: tag -> [(step, value)]."""
    reader = event_accumulator.EventAccumulator(str(directory))
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def test_a_run_writes_the_logs_numbers_to_tensorboard(tmp_path):
    board = tmp_path / "tb"
    config = synthetic(tmp_path, "train.steps=10", "train.eval_every=5", f'train.tensorboard_dir="{board}"')
    TrainJob(config, progress_bar=False).run()
    log = events(tmp_path / "metrics.jsonl")
    scalars = _scalars(board)
    train = [e for e in log if e["event"] == "train"]
    assert [s for s, _ in scalars["train/loss"]] == [e["step"] for e in train] == [5, 10]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([e["loss"] for e in train])
    evals = [e for e in log if e["event"] == "eval"]
    assert [(s, pytest.approx(v)) for s, v in scalars["eval/auc"]] == [(e["step"], e["auc"]) for e in evals]
    assert {"train/examples_per_s", "eval/ne", "eval/log_loss", "checkpoint/examples"} <= set(scalars)


def test_a_resumed_run_hides_what_a_failed_attempt_logged_past_its_checkpoint(tmp_path):
    board = tmp_path / "tb"
    writer = TensorBoardLog(board)  # a failed attempt: checkpoint at step 4, logged on to step 6
    for step, loss in [(2, 0.9), (4, 0.8), (6, 0.7)]:
        writer.write({"event": "train", "step": step, "loss": loss, "time": 1.0 * step})
    writer.close()
    resumed = TensorBoardLog(board, start_step=4)
    resumed.write({"event": "train", "step": 6, "loss": 0.75, "time": 10.0})
    resumed.close()
    shown = _scalars(board)["train/loss"]  # the first attempt's step 6 is purged, the resumed one's shown
    assert [s for s, _ in shown] == [2, 4, 6] and [v for _, v in shown] == pytest.approx([0.9, 0.8, 0.75])


def test_without_the_tensorboard_package_the_run_stops_before_the_first_step(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("tensorboard") or name == "torch.utils.tensorboard":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    for name in [m for m in sys.modules if m.startswith(("tensorboard", "torch.utils.tensorboard"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    board = tmp_path / "tb"
    args = ["--config", SYNTHETIC, "--no-progress", "--set", f'train.tensorboard_dir="{board}"']
    args += ["--set", f'checkpoint.dir="{tmp_path / "ckpt"}"', "--set", "train.steps=2"]
    assert main(["train", *args]) == 2
    line = _one_line_error(capsys)
    assert "train.tensorboard_dir: TensorBoard logs need the tensorboard package: pip install" in line
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(ConfigError, match="rectrain\\[tensorboard\\]"):
        TensorBoardLog(board)
