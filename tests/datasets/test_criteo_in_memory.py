"""InMemoryBinaryCriteoIterDataPipe: batches dealt to ranks in turn, every row once, one KJT per batch."""

import numpy as np
import pytest

from rectrain.datasets.criteo_in_memory import InMemoryBinaryCriteoIterDataPipe


@pytest.fixture
def days(tmp_path):
    paths = {"dense": [], "sparse": [], "labels": []}
    first = 0
    for rows in (7, 6):
        ids = np.arange(first, first + rows)
        for kind, array in (
            ("dense", np.stack([ids] * 13, axis=1).astype(np.float32)),
            ("sparse", np.stack([ids] * 26, axis=1).astype(np.int32)),
            ("labels", ids.reshape(-1, 1).astype(np.int32)),
        ):
            paths[kind].append(str(tmp_path / f"day{first}_{kind}.npy"))
            np.save(paths[kind][-1], array)
        first += rows
    return paths


def _data(days, **kwargs):
    return InMemoryBinaryCriteoIterDataPipe(
        dense_paths=days["dense"], sparse_paths=days["sparse"], labels_paths=days["labels"], **kwargs
    )


def test_ranks_take_batches_in_turn_and_share_the_last_round(days):
    seen = []
    for rank in range(2):
        data = _data(days, stage="train", batch_size=4, rank=rank, world_size=2)
        labels = [b.labels.tolist() for b in data]
        assert len(data) == len(labels) == 2
        seen.append(labels)
    # 13 rows: one full round of 4 + 4, then the 5 left split 3 + 2
    assert seen == [[[0, 1, 2, 3], [8, 9, 10]], [[4, 5, 6, 7], [11, 12]]]


def test_batches_are_feature_major_kjts_with_hashed_ids(days):
    batch = next(iter(_data(days, stage="train", batch_size=3, rank=0, world_size=1, hashes=[2] * 26)))
    kjt = batch.sparse_features
    assert kjt.keys()[0] == "cat_0" and kjt.stride() == 3
    assert kjt["cat_5"].values().tolist() == [0, 1, 0]
    assert batch.dense_features.shape == (3, 13)


def test_val_and_test_halve_the_first_file(days):
    val = [b.labels.tolist() for b in _data(days, stage="val", batch_size=10, rank=0, world_size=1)]
    test = [b.labels.tolist() for b in _data(days, stage="test", batch_size=10, rank=0, world_size=1)]
    assert val[0][:4] == [0, 1, 2, 3] and test[0][:3] == [4, 5, 6]


def test_shuffled_training_set_gives_each_rank_a_disjoint_part(days):
    parts = [
        sum(
            (
                b.labels.tolist()
                for b in _data(
                    days, stage="train", batch_size=2, rank=r, world_size=2, shuffle_training_set=True
                )
            ),
            [],
        )
        for r in range(2)
    ]
    assert sorted(parts[0] + parts[1]) == list(range(13)) and len(parts[0]) == 7
