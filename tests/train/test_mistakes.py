"""A newcomer's mistakes (issue 38), each stopped before the first step or reported in one line naming the
file and the fix, and none losing a trained step: an unwritable checkpoint directory, a truncated ``.gz``, a
binary file or gzip data named ``.tsv``, a damaged converted part, NaN in Parquet, other data into a run's
checkpoint directory; and a restart marked in the metrics log."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rectrain.cli import main
from tests.distributed.multiprocess import run_multiprocess
from tests.train.test_job import SMALL_CRITEO_MODEL, events, write_criteo
from tests.train.test_preflight import CRITEO, _criteo_args, _one_line_error, events_or_none

BATCH = 64


def _args(tmp_path: Path, data: Path | str, *overrides: str) -> list[str]:
    """``rectrain train`` of the Criteo example on ``data`` (small model, batch 64, checkpoints under
    ``tmp_path/ckpt``)."""
    pairs = (f'data.paths=["{data}"]', f'data.eval_paths=["{data}"]', f"train.batch_size={BATCH}")
    return _criteo_args(tmp_path, *pairs, *overrides)


def _train_steps(tmp_path: Path) -> list[int]:
    return [e["step"] for e in events_or_none(tmp_path / "metrics.jsonl") if e["event"] == "train"]


def _checkpoints(tmp_path: Path) -> list[str]:
    ckpt = tmp_path / "ckpt"
    return sorted(p.name for p in ckpt.glob("step_*")) if ckpt.is_dir() else []


@pytest.mark.parametrize("key", ["checkpoint.dir", "train.metrics_log"])
def test_an_unwritable_output_path_stops_the_run_before_the_first_step(tmp_path, capsys, key):
    # /proc cannot take a new file even for root, for whom os.access says yes: the check must write.
    where = "/proc/rectrain-issue-38/out"
    data = write_criteo(tmp_path / "train.tsv", rows=64)
    assert main(["train", *_args(tmp_path, data, f'{key}="{where}"')]) == 2
    line = _one_line_error(capsys)
    assert f"{key}: cannot write" in line and where in line and "choose a" in line
    assert _train_steps(tmp_path) == [] and _checkpoints(tmp_path) == []


def _truncated_gz(path: Path, rows: int, keep: float) -> Path:
    text = write_criteo(path.with_suffix(""), rows=rows).read_bytes()
    packed = gzip.compress(text)
    path.write_bytes(packed[: int(len(packed) * keep)])
    return path


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_truncated_gz_is_one_line_naming_it_and_the_steps_trained_are_kept(tmp_path, capsys, num_workers):
    # 6,000 rows are 1.3 MB of text: the reader's first 1 MiB block is whole, the next one ends early.
    data = _truncated_gz(tmp_path / "day.tsv.gz", rows=6000, keep=0.9)
    assert main(["train", *_args(tmp_path, data, f"data.num_workers={num_workers}")]) == 2
    line = _one_line_error(capsys)
    fix = "download or compress the file again"
    assert line == f"rectrain: error: {data}: the gzip stream ends early (truncated); {fix}"
    steps = _train_steps(tmp_path)
    assert steps and _checkpoints(tmp_path) == [f"step_{steps[-1]}"]  # the last step trained, no step_0


def test_a_gz_truncated_at_its_start_stops_the_run_before_the_first_step(tmp_path, capsys):
    data = _truncated_gz(tmp_path / "day.tsv.gz", rows=100, keep=0.5)
    assert main(["train", *_args(tmp_path, data)]) == 2
    assert f"{data}: the gzip stream ends early (truncated)" in _one_line_error(capsys)
    assert _train_steps(tmp_path) == [] and not (tmp_path / "ckpt").exists()


def _wrong_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Files that are not Criteo text, and the error each gives."""
    text = write_criteo(tmp_path / "rows.tsv", rows=200).read_bytes()
    named_tsv = tmp_path / "day_0.tsv"
    named_tsv.write_bytes(gzip.compress(text))
    binary = tmp_path / "model.tsv"
    binary.write_bytes(bytes(range(256)) * 64)
    csv = tmp_path / "clicks.tsv"
    csv.write_text("".join(f"{i % 2},{i},{i * 7}\n" for i in range(200)))
    return {
        "gzip named .tsv": (named_tsv, f"{named_tsv} is gzip data not named .gz; rename it to day_0.tsv.gz"),
        "binary": (
            binary,
            f"{binary} is binary (a NUL byte at offset 0), not text; give Criteo TSV text files",
        ),
        "other text": (
            csv,
            f"{csv}: none of its first 100 lines is a Criteo TSV row (line 1: column *: expected 40 "
            "tab-separated columns, got 1); is it the right file",
        ),
    }


@pytest.mark.parametrize("case", ["gzip named .tsv", "binary", "other text"])
def test_a_file_that_is_not_criteo_text_stops_the_run_before_the_first_step(tmp_path, capsys, case):
    path, message = _wrong_files(tmp_path)[case]
    assert main(["train", *_args(tmp_path, path)]) == 2
    line = _one_line_error(capsys)
    assert f"data.paths: file {message}" in line and "diverged" not in line
    assert _train_steps(tmp_path) == [] and not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("case", ["gzip named .tsv", "binary", "other text"])
def test_data_convert_refuses_a_file_that_is_not_criteo_text(tmp_path, capsys, case):
    path, message = _wrong_files(tmp_path)[case]
    out = tmp_path / "conv"
    assert main(["data", "convert", "--no-progress", "--out", str(out), str(path)]) == 2
    assert f"input file {message}" in _one_line_error(capsys)
    assert not (out / "manifest.json").exists()


def test_data_convert_of_a_truncated_gz_fails_in_one_line_without_a_manifest(tmp_path, capsys):
    data = _truncated_gz(tmp_path / "day.tsv.gz", rows=6000, keep=0.9)
    out = tmp_path / "conv"
    assert main(["data", "convert", "--no-progress", "--out", str(out), str(data)]) == 2
    assert f"{data}: the gzip stream ends early (truncated)" in _one_line_error(capsys)
    assert not (out / "manifest.json").exists()


def test_data_verify_flags_a_conversion_that_read_no_rows(tmp_path, capsys):
    from rectrain.datasets.columnar.writer import ColumnarWriter
    from rectrain.datasets.convert import _template
    from rectrain.datasets.criteo import CriteoConfig

    # What an earlier rectrain wrote from a binary file: a manifest of 0 rows, every line skipped.
    out = tmp_path / "conv"
    out.mkdir()
    writer = ColumnarWriter(out, _template(CriteoConfig(paths=["x"])), 1000)
    writer.finish(source={"paths": ["/data/model.tsv"], "rows_read": 0, "rows_skipped": 4210})
    assert main(["data", "verify", str(out)]) == 2
    line = _one_line_error(capsys)
    assert "0 rows converted, 4,210 malformed lines skipped" in line and "['/data/model.tsv']" in line


def _converted(tmp_path: Path, capsys) -> Path:
    tsv = write_criteo(tmp_path / "day.tsv", rows=BATCH * 12)
    out = tmp_path / "conv"
    args = ["data", "convert", "--num-embeddings", "50", "--rows-per-file", "256", "--no-progress"]
    assert main([*args, "--out", str(out), str(tsv)]) == 0
    capsys.readouterr()
    return out


def test_a_damaged_converted_part_is_named_before_the_first_step(tmp_path, capsys):
    conv = _converted(tmp_path, capsys)
    part = sorted(conv.glob("part-*.safetensors"))[1]
    raw = bytearray(part.read_bytes())
    raw[-100:-90] = b"\xff" * 10  # flipped bytes in the ids: same size, other content
    part.write_bytes(bytes(raw))
    assert main(["train", *_args(tmp_path, conv, 'data.source="converted"')]) == 2
    line = _one_line_error(capsys)
    assert (
        f"{part} does not match the sha256 its manifest records" in line and "convert the data again" in line
    )
    assert _train_steps(tmp_path) == [] and _checkpoints(tmp_path) == []


def _parquet_with_nan(path: Path, rows: int, nan_row: int) -> None:
    rng = np.random.default_rng(0)
    columns = {"y": rng.integers(0, 2, rows).astype(np.float32)}
    columns |= {f"d{i}": rng.random(rows) for i in range(13)}
    columns["d3"][nan_row] = np.nan
    columns |= {f"cat_{i}": rng.integers(0, 10**9, rows) for i in range(26)}
    pq.write_table(pa.table(columns), path, row_group_size=BATCH * 4)


def test_nan_in_parquet_dense_values_is_a_data_error_naming_file_row_and_column(tmp_path, capsys):
    data = tmp_path / "clicks.parquet"
    _parquet_with_nan(data, rows=BATCH * 12, nan_row=BATCH * 8 + 5)  # in the third row group
    dense = "data.dense_columns=[" + ", ".join(f'"d{i}"' for i in range(13)) + "]"
    args = _args(tmp_path, data, 'data.source="parquet"', 'data.label_column="y"', dense)
    assert main(["train", *args]) == 2
    line = _one_line_error(capsys)
    assert f"{data}: row {BATCH * 8 + 5}: dense column 'd3' is nan" in line and "diverged" not in line
    steps = _train_steps(tmp_path)
    assert steps and _checkpoints(tmp_path) == [f"step_{steps[-1]}"]


def test_other_data_into_a_runs_checkpoints_is_refused_and_overwrite_starts_afresh(tmp_path, capsys):
    first = write_criteo(tmp_path / "a.tsv", rows=BATCH * 4)
    assert main(["train", *_args(tmp_path, first)]) == 0
    assert _checkpoints(tmp_path) == ["step_4"]
    other = write_criteo(tmp_path / "b.tsv", rows=BATCH * 6, seed=1)
    assert main(["train", *_args(tmp_path, other)]) == 2
    line = _one_line_error(capsys)
    assert (
        f"holds the checkpoints of a run on other data (data.paths were ['{first}']); pass --overwrite"
        in line
    )
    assert main(["train", *_args(tmp_path, other), "--overwrite"]) == 0
    out = capsys.readouterr().out
    assert "trained 6 steps /" in out and "resumed" not in out  # afresh, on the new file
    assert _checkpoints(tmp_path) == ["step_6"]
    size = other.stat().st_size
    other.write_text(other.read_text() + other.read_text())  # the same path, other contents
    assert main(["train", *_args(tmp_path, other)]) == 2
    assert f"{other} had {size:,} bytes or rows, now {2 * size:,}" in _one_line_error(capsys)


def test_a_restart_is_marked_in_the_metrics_log_and_resumes_despite_overwrite(tmp_path, capsys, monkeypatch):
    data = write_criteo(tmp_path / "a.tsv", rows=BATCH * 4)
    assert main(["train", *_args(tmp_path, data, "train.steps=2", "train.log_every=1"), "--overwrite"]) == 0
    # torchrun restarted the job after a failure: the same command line, TORCHELASTIC_RESTART_COUNT=1
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert main(["train", *_args(tmp_path, data, "train.log_every=1"), "--overwrite"]) == 0
    assert "resumed at step 2" in capsys.readouterr().out
    kept = ("train", "checkpoint", "resume")
    log = [(e["event"], e["step"]) for e in events(tmp_path / "metrics.jsonl") if e["event"] in kept]
    assert log.index(("resume", 2)) == log.index(("checkpoint", 2)) + 1
    assert [e for e in events(tmp_path / "metrics.jsonl") if e["event"] == "resume"][0]["attempt"] == 1
    assert [s for e, s in log if e == "train"] == [1, 2, 3, 4]


def test_a_resume_on_the_same_data_is_marked_too(tmp_path):
    data = write_criteo(tmp_path / "a.tsv", rows=BATCH * 4)
    assert main(["train", *_args(tmp_path, data, "train.steps=2")]) == 0
    assert main(["train", *_args(tmp_path, data)]) == 0
    resumed = [e for e in events(tmp_path / "metrics.jsonl") if e["event"] == "resume"]
    assert [(e["step"], e["attempt"]) for e in resumed] == [(2, 0)]
    assert json.loads((tmp_path / "ckpt" / "step_4" / "manifest.json").read_text())["extra"]["data"] == {
        "source": "criteo",
        "paths": [[str(data), data.stat().st_size]],
    }


def _preflight_rank(env, overrides: list[str]) -> str:
    from rectrain.errors import ConfigError
    from rectrain.train.config import RunConfig
    from rectrain.train.job import TrainJob

    try:
        TrainJob(RunConfig.load(CRITEO, overrides), env, progress_bar=False).run()
    except ConfigError as e:
        return str(e)
    return "trained"


@pytest.mark.slow
def test_two_ranks_share_the_converted_parts_sha256_and_stop_together(tmp_path, capsys):
    conv = _converted(tmp_path, capsys)
    part = sorted(conv.glob("part-*.safetensors"))[1]  # rank 1 hashes parts 1 and 3
    raw = bytearray(part.read_bytes())
    raw[-8:] = b"\x00" * 8
    part.write_bytes(bytes(raw))
    overrides = [
        *SMALL_CRITEO_MODEL,
        'data.source="converted"',
        f'data.paths=["{conv}"]',
        "data.num_workers=0",
        f"train.batch_size={BATCH}",
        f'checkpoint.dir="{tmp_path / "ckpt"}"',
    ]
    rank0, rank1 = run_multiprocess(_preflight_rank, 2, overrides)
    assert f"{part} does not match the sha256" in rank1
    assert rank0 == "a path check failed on another rank (see its error)"
    assert _checkpoints(tmp_path) == []
