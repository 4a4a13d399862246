"""make_hash_zch_buckets_non_persistent leaves the bucket count out of checkpoints."""

import torch
from torch import nn

from rectrain.modules.utils import make_hash_zch_buckets_non_persistent
from rectrain.zch.hash_zch import HashZchManagedCollisionModule


def test_bucket_buffers_leave_the_state_dict_but_stay_readable():
    model = nn.Module()
    model.add_module(
        "mc", HashZchManagedCollisionModule(zch_size=8, device=torch.device("cpu"), total_num_buckets=2)
    )
    assert "mc._hash_zch_bucket" in model.state_dict()
    assert make_hash_zch_buckets_non_persistent(model) == 1
    assert "mc._hash_zch_bucket" not in model.state_dict()
    assert int(model.mc.get_buffer("_hash_zch_bucket")) == 2
    assert make_hash_zch_buckets_non_persistent(model) == 0
