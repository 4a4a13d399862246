"""bucketize_kjt_before_all2all splits each feature's ids into the row blocks of a row-wise sharding."""

import torch

from rectrain.distributed.embedding_sharding import bucketize_kjt_before_all2all
from rectrain.sparse import KeyedJaggedTensor


def test_ids_go_to_the_bucket_of_their_block():
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.tensor([1, 7, 4, 12, 3]), lengths=torch.tensor([2, 1, 1, 1])
    )
    bucketed, permute = bucketize_kjt_before_all2all(kjt, num_buckets=2, block_sizes=torch.tensor([5, 10]))
    assert bucketed.keys() == ["a", "b", "a", "b"]
    # bucket 0: a's [1], [4]; b's [], [3]; bucket 1: a's [7 -> 2], []; b's [12 -> 2], []
    assert bucketed.lengths().tolist() == [1, 1, 0, 1, 1, 0, 1, 0]
    assert bucketed.values().tolist() == [1, 4, 3, 2, 2]
    assert permute is None
    kept, _ = bucketize_kjt_before_all2all(kjt, 2, torch.tensor([5, 10]), keep_original_indices=True)
    assert kept.values().tolist() == [1, 4, 3, 7, 12]
