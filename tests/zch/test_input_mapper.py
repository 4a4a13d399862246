"""Which bucket of a multi-probe ZCH table an id probes in, and hits counted per row."""

import torch

from rectrain.zch.input_mapper import TrainInputMapper, _compute_lengths_from_hits


def _mapper(input_hash_size, divide=False):
    sizes = torch.tensor([4, 4, 8])
    return TrainInputMapper(input_hash_size, 3, sizes, torch.tensor([0, 4, 8]), divide)


def test_unknown_id_range_buckets_by_modulo():
    values, sizes, starts = _mapper(0)(torch.tensor([0, 1, 2, 5]))
    assert values.tolist() == [0, 1, 2, 5]
    assert sizes.tolist() == [4, 4, 8, 8] and starts.tolist() == [0, 4, 8, 8]


def test_known_id_range_buckets_by_blocks_and_can_divide():
    values, _, starts = _mapper(30, divide=True)(torch.tensor([0, 9, 10, 29]))
    assert starts.tolist() == [0, 0, 4, 8]  # blocks of ceil(30 / 3) = 10 ids
    assert values.tolist() == [0, 9, 0, 9]


def test_a_shard_sees_offsets_relative_to_its_first_row():
    _, _, starts = _mapper(0)(torch.tensor([1, 2]), output_offset=torch.tensor([4]))
    assert starts.tolist() == [0, 4]


def test_hits_are_counted_per_row():
    hits = torch.tensor([True, False, True, True, False])
    assert _compute_lengths_from_hits(torch.tensor([2, 0, 3]), hits).tolist() == [1, 0, 2]
