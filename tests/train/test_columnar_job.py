"""Training runs on converted data and on Parquet: the same run as from the TSV, checks against the model,
and two ranks reading global row ranges."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rectrain.cli import main
from rectrain.errors import ConfigError
from rectrain.train.config import RunConfig
from rectrain.train.data import RunData
from rectrain.train.job import TrainJob
from tests.train.test_job import EXAMPLES, SMALL_CRITEO_MODEL, write_criteo

CRITEO = EXAMPLES / "dlrm_criteo.toml"


def _run(tmp_path, *overrides: str) -> list[str]:
    return [
        *SMALL_CRITEO_MODEL,
        "train.batch_size=32",
        "train.epochs=1",
        "train.eval_batches=2",
        "data.num_workers=0",
        f'train.metrics_log="{tmp_path / "metrics.jsonl"}"',
        'checkpoint.dir=""',
        *overrides,
    ]


def test_a_run_on_converted_data_is_the_run_on_the_tsv(tmp_path, capsys):
    tsv = write_criteo(tmp_path / "day.tsv", rows=32 * 3 + 5)
    text_run = _run(tmp_path, f'data.paths=["{tsv}"]', f'data.eval_paths=["{tsv}"]')
    sets = [a for pair in text_run for a in ("--set", pair)]
    assert (
        main(
            [
                "data",
                "convert",
                "--config",
                str(CRITEO),
                *sets,
                "--out",
                str(tmp_path / "conv"),
                "--no-progress",
            ]
        )
        == 0
    )
    assert "converted 101 criteo rows (0 malformed skipped)" in capsys.readouterr().out
    from_text = TrainJob(RunConfig.load(CRITEO, text_run), progress_bar=False).run()
    conv = tmp_path / "conv"
    converted_run = _run(
        tmp_path, 'data.source="converted"', f'data.paths=["{conv}"]', f'data.eval_paths=["{conv}"]'
    )
    from_converted = TrainJob(RunConfig.load(CRITEO, converted_run), progress_bar=False).run()
    end, text_end = from_converted.end, from_text.end
    assert (end.step, end.examples) == (text_end.step, text_end.examples) and text_end.step == 4
    assert (end.data.epoch, end.data.offset) == (text_end.data.epoch, text_end.data.offset)  # same position
    assert from_converted.eval_metrics == from_text.eval_metrics


def test_converted_data_must_fit_the_models_tables(tmp_path, capsys):
    tsv = write_criteo(tmp_path / "day.tsv", rows=64)
    assert (
        main(
            [
                "data",
                "convert",
                "--num-embeddings",
                "60",
                "--out",
                str(tmp_path / "c"),
                "--no-progress",
                str(tsv),
            ]
        )
        == 0
    )
    config = RunConfig.load(
        CRITEO, _run(tmp_path, 'data.source="converted"', f'data.paths=["{tmp_path / "c"}"]')
    )
    with pytest.raises(ConfigError, match=r"cat_0: 60 \(table has 50\).*convert again"):
        list(RunData(config, 0, 1).train_batches())
    bigger_dense = _run(
        tmp_path, 'data.source="converted"', f'data.paths=["{tmp_path / "c"}"]', "model.dense_in_features=4"
    )
    with pytest.raises(ConfigError, match="dense_in_features is 4 but converted data give 13"):
        next(RunData(RunConfig.load(CRITEO, bigger_dense), 0, 1).train_batches())


def _parquet(path, rows: int) -> None:
    rng = np.random.default_rng(0)
    columns = {"y": rng.integers(0, 2, rows).astype(np.float32)}
    columns |= {f"d{i}": rng.random(rows) for i in range(13)}
    columns |= {f"cat_{i}": rng.integers(0, 10**9, rows) for i in range(26)}
    pq.write_table(pa.table(columns), path, row_group_size=50)


def test_a_run_on_parquet_with_named_columns_trains(tmp_path):
    _parquet(tmp_path / "train.parquet", 32 * 10)
    overrides = _run(
        tmp_path,
        'data.source="parquet"',
        f'data.paths=["{tmp_path / "train.parquet"}"]',
        'data.label_column="y"',
        "data.dense_columns=[" + ", ".join(f'"d{i}"' for i in range(13)) + "]",
        "data.shuffle=true",
    )
    summary = TrainJob(RunConfig.load(CRITEO, overrides), progress_bar=False).run()
    assert summary.end.step == 9 and summary.eval_metrics["num_examples"] == 32
    with pytest.raises(ConfigError, match="data.dense_columns give 2 dense values"):
        wrong = RunConfig.load(CRITEO, [*overrides, 'data.dense_columns=["d0", "d1"]'])
        next(RunData(wrong, 0, 1).train_batches())


def _first_ids(run_data: RunData) -> list[int]:
    """The first id of every training example a rank reads (a row's fingerprint)."""
    return [
        v
        for item in run_data.train_batches()
        for v in item.batch.sparse_features.values().reshape(26, -1)[0].tolist()
    ]


def test_two_ranks_read_their_blocks_of_each_window_of_the_converted_data(tmp_path):
    tsv = write_criteo(tmp_path / "day.tsv", rows=32 * 8)
    out = tmp_path / "c"
    assert (
        main(["data", "convert", "--num-embeddings", "50", "--out", str(out), "--no-progress", str(tsv)]) == 0
    )
    overrides = _run(
        tmp_path, 'data.source="converted"', f'data.paths=["{out}"]', f'data.eval_paths=["{out}"]'
    )
    config = RunConfig.load(CRITEO, overrides)
    rank0, rank1 = (_first_ids(RunData(config, rank, 2)) for rank in range(2))
    interleaved = [
        v for step in range(4) for part in (rank0, rank1) for v in part[32 * step : 32 * step + 32]
    ]
    assert interleaved == _first_ids(RunData(config, 0, 1))


def test_converted_data_is_read_in_process_whatever_num_workers_says(tmp_path, capsys):
    tsv = write_criteo(tmp_path / "day.tsv", rows=32 * 4)
    out = tmp_path / "c"
    assert (
        main(["data", "convert", "--num-embeddings", "50", "--out", str(out), "--no-progress", str(tsv)]) == 0
    )
    base = _run(tmp_path, 'data.source="converted"', f'data.paths=["{out}"]', f'data.eval_paths=["{out}"]')
    threaded = RunData(RunConfig.load(CRITEO, base), 0, 1)
    capsys.readouterr()
    workers = RunData(RunConfig.load(CRITEO, [*base, "data.num_workers=2"]), 0, 1)
    assert _first_ids(workers) == _first_ids(threaded)
    # logged through the handler `rectrain data convert` set up (on the captured stderr)
    assert "data.num_workers=2: converted data is read by the prefetch thread" in capsys.readouterr().err
