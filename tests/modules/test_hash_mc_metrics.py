"""ScalarLogger counts a ZCH table's hits, inserts and collisions and reports their rates when due."""

import torch

from rectrain.modules.hash_mc_metrics import ScalarLogger, ScalarLoggerBackend


class Recorder(ScalarLoggerBackend):
    def __init__(self) -> None:
        self.reports = []

    def report(self, log_message, name, run_type, step, rate_metrics):
        self.reports.append((name, run_type, step, rate_metrics))


def _logger(backend, frequency=2, start_bucket=0):
    return ScalarLogger("t", 4, frequency, start_bucket, 1, 0, torch.device("cpu"), False, backend=backend)


def test_rates_are_reported_every_frequency_steps_then_reset():
    backend = Recorder()
    logger = _logger(backend)
    before = torch.tensor([[1], [-1], [3], [-1]])
    after = torch.tensor([[1], [2], [3], [-1]])
    # id 1 hits its row, id 2 takes a free row, id 9 collides into id 3's row
    logger.update(
        before,
        after,
        torch.tensor([1, 2, 9]),
        torch.tensor([0, 1, 2]),
        torch.ones(3, dtype=torch.bool),
        None,
        None,
    )
    logger("train", after)
    assert backend.reports == []
    logger("train", after)
    name, run_type, step, rates = backend.reports[0]
    assert (name, run_type, step) == ("t", "train", 2)
    assert rates["hit_rate"] == round(1 / 3, 3) and rates["insert_rate"] == round(1 / 3, 3)
    assert rates["collision_rate"] == round(1 / 3, 3) and rates["table_usage_ratio"] == 0.75
    assert logger._total_cnt == 0


def test_only_the_shard_with_bucket_zero_reports():
    logger = _logger(Recorder(), frequency=1, start_bucket=1)
    logger._total_cnt = 5
    assert not logger.should_report()
