"""Threshold filters keep rare ids out of a managed-collision table."""

import torch

from rectrain.zch.filters import (
    average_threshold_filter,
    dynamic_threshold_filter,
    probabilistic_threshold_filter,
)


def test_dynamic_threshold_is_the_mean_count_times_the_multiplier():
    counts = torch.tensor([5, 4, 3, 2, 1])
    mask, threshold = dynamic_threshold_filter(counts, threshold_skew_multiplier=0.75)
    assert float(threshold) == 15 / 5 * 0.75
    assert mask.tolist() == [True, True, True, False, False]


def test_average_threshold_keeps_counts_above_the_mean():
    mask, threshold = average_threshold_filter(torch.tensor([10, 1, 1]))
    assert float(threshold) == 4.0
    assert mask.tolist() == [True, False, False]


def test_probabilistic_filter_admits_frequent_ids_more_often():
    torch.manual_seed(0)
    admitted = torch.zeros(2)
    for _ in range(200):
        mask, _ = probabilistic_threshold_filter(torch.tensor([1, 300]), per_id_probability=0.01)
        admitted += mask.float()
    assert admitted[0] < 20 and admitted[1] > 180
