"""Nothing trained is lost to a mistake found late: paths checked before the first step, one-line errors,
the final checkpoint before the final evaluation, a failing evaluation logged, a fresh start that would
write beside old checkpoints refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rectrain.cli import main
from rectrain.errors import ConfigError
from rectrain.train.config import RunConfig
from rectrain.train.job import TrainJob
from tests.train.test_job import EXAMPLES, SMALL_CRITEO_MODEL, events, synthetic, write_criteo

CRITEO = str(EXAMPLES / "dlrm_criteo.toml")
SYNTHETIC = str(EXAMPLES / "dlrm_synthetic.toml")


# The events whose order these tests check (a run also logs its kernel choice, resumes, ...).
ORDERED = ("eval", "eval_failed", "checkpoint")


def _criteo_args(tmp_path: Path, *overrides: str) -> list[str]:
    data = write_criteo(tmp_path / "train.tsv", rows=64)
    pairs = [
        *SMALL_CRITEO_MODEL,
        f'data.paths=["{data}"]',
        "data.num_workers=0",
        "train.batch_size=16",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
        *overrides,
    ]
    return ["--config", CRITEO, "--no-progress", *[a for p in pairs for a in ("--set", p)]]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rectrain: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.mark.parametrize(
    ("make_override", "message"),
    [
        (lambda t: f'data.paths=["{t / "no.tsv"}"]', r"data\.paths: file \S+no\.tsv does not exist"),
        (lambda t: f'data.paths=["{t}"]', r"data\.paths: file \S+ is a directory; list the files inside it"),
        (
            lambda t: f'data.eval_paths=["{t / "held_out.tsv"}"]',
            r"data\.eval_paths: file \S+held_out\.tsv does not exist; fix the path",
        ),
        (lambda t: 'train.metrics_log=""', r'train\.metrics_log: "" is not a file; give a path'),
        (lambda t: f'train.metrics_log="{t}"', r"train\.metrics_log: \S+ is a directory; give a file path"),
        (lambda t: f'checkpoint.dir="{t / "train.tsv"}"', r"checkpoint\.dir: \S+ is a file, not a directory"),
    ],
)
def test_a_wrong_path_stops_the_run_before_the_first_step(tmp_path, capsys, make_override, message):
    assert main(["train", *_criteo_args(tmp_path, make_override(tmp_path))]) == 2
    assert re.search(message, _one_line_error(capsys))
    assert not [e for e in events_or_none(tmp_path / "metrics.jsonl") if e["event"] == "train"]
    assert not (tmp_path / "ckpt").exists()


def events_or_none(path: Path) -> list[dict]:
    return events(path) if path.is_file() else []


def test_config_on_a_directory_and_plan_out_into_a_missing_directory_are_one_line_errors(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path)]) == 2
    assert f"config file {tmp_path} is a directory; give the run's TOML file" in _one_line_error(capsys)
    out = tmp_path / "no" / "such" / "plan.json"
    assert main(["plan", "--config", SYNTHETIC, "--out", str(out)]) == 2
    line = _one_line_error(capsys)
    assert f"--out {out}: directory {out.parent} does not exist; create it first" in line
    assert ".tmp" not in line


@pytest.mark.slow
def test_a_failing_final_evaluation_leaves_the_checkpoint_of_the_last_step(tmp_path):
    train = write_criteo(tmp_path / "train.tsv", rows=4 * 16)
    held_out = write_criteo(tmp_path / "eval.tsv", rows=16)
    held_out.write_text("not a criteo row\n" + held_out.read_text())
    overrides = [
        *SMALL_CRITEO_MODEL,
        f'data.paths=["{train}"]',
        f'data.eval_paths=["{held_out}"]',
        "data.num_workers=0",
        "data.strict=true",  # the held-out file's first row is malformed: evaluation fails
        "train.batch_size=16",
        "train.eval_every=2",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
    ]
    summary = TrainJob(RunConfig.load(CRITEO, overrides), progress_bar=False).run()
    assert summary.end.step == 4 and summary.checkpoint == tmp_path / "ckpt" / "step_4"
    assert "eval.tsv:1: column *" in summary.eval_error
    log = [(e["event"], e["step"]) for e in events(tmp_path / "metrics.jsonl") if e["event"] in ORDERED]
    assert log == [("eval_failed", 2), ("eval_failed", 4), ("checkpoint", 4)]


@pytest.mark.slow
def test_the_final_checkpoint_is_written_before_the_final_evaluation(tmp_path):
    TrainJob(synthetic(tmp_path, "train.steps=3", "train.eval_every=0"), progress_bar=False).run()
    log = [(e["event"], e["step"]) for e in events(tmp_path / "metrics.jsonl") if e["event"] in ORDERED]
    assert log == [("checkpoint", 3), ("eval", 3)]


def test_a_fresh_start_refuses_a_directory_with_checkpoints_unless_overwrite(tmp_path):
    TrainJob(synthetic(tmp_path, "train.steps=2", "train.eval_every=0"), progress_bar=False).run()
    fresh = synthetic(tmp_path, "train.steps=3", "train.eval_every=0", "checkpoint.resume=false")
    refused = r"checkpoint\.resume = false but \S+ already holds checkpoints \(step_2\); pass --overwrite"
    with pytest.raises(ConfigError, match=refused):
        TrainJob(fresh, progress_bar=False).run()
    overwrite = synthetic(tmp_path, "train.steps=3", "train.eval_every=0", "checkpoint.resume=false")
    overwrite.checkpoint.overwrite = True
    summary = TrainJob(overwrite, progress_bar=False).run()
    assert summary.start.step == 0
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest", "step_3"]


def test_leftovers_of_an_interrupted_clean_up_are_removed_at_the_next_start(tmp_path):
    TrainJob(synthetic(tmp_path, "train.steps=2", "train.eval_every=0"), progress_bar=False).run()
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_1").mkdir()  # a checkpoint half deleted by a killed clean-up, its manifest gone
    (ckpt / "step_1" / "rank_0.safetensors").write_bytes(b"partial")
    (ckpt / ".tmp_step_3").mkdir()  # a save killed midway
    summary = TrainJob(synthetic(tmp_path, "train.steps=3", "train.eval_every=0"), progress_bar=False).run()
    assert summary.start.step == 2
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_2", "step_3"]
    assert json.loads((ckpt / "step_3" / "manifest.json").read_text())["data_position"]["unit"] == "batches"
