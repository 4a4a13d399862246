"""recserve.runtime.staging: a batch packed into one reused buffer and copied once (CPU stand-in; GPU)."""

from __future__ import annotations

import pytest
import torch

from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor
from recserve.runtime.staging import Staging
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import dlrm_config, request, trained_state

CFG = dlrm_config()


def _kjt(weighted: bool, ids_dtype: torch.dtype = torch.int64) -> KeyedJaggedTensor:
    values = torch.tensor([3, 1, 4, 1, 5, 9, 2], dtype=ids_dtype)
    return KeyedJaggedTensor(
        keys=["a", "b"],
        values=values,
        weights=torch.rand(7) if weighted else None,
        lengths=torch.tensor([2, 1, 0, 4]),
        length_per_key=[3, 4],
    )


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_a_batch_comes_out_equal_with_its_counts(weighted, ids_dtype):
    staging = Staging("cpu", pin=False)
    dense, kjt = torch.randn(2, 5).to(torch.bfloat16), _kjt(weighted, ids_dtype)
    dense_d, kjt_d = staging.to_device(dense, kjt)
    assert torch.equal(dense_d, dense) and dense_d.dtype == torch.bfloat16
    assert torch.equal(kjt_d.values(), kjt.values()) and kjt_d.values().dtype == ids_dtype
    assert torch.equal(kjt_d.offsets(), kjt.offsets())
    assert kjt_d.keys() == ["a", "b"] and kjt_d.stride() == 2
    assert kjt_d.length_per_key_or_none() == [3, 4]  # the host's counts travel: no read on the device
    assert (kjt_d.weights_or_none() is None) == (not weighted)
    if weighted:
        assert torch.equal(kjt_d.weights(), kjt.weights())
    # Every tensor is a view of the one device buffer, each on its own aligned start.
    starts = [t.data_ptr() for t in (dense_d, kjt_d.values(), kjt_d.offsets())]
    assert len(set(starts)) == 3 and all(s % 64 == starts[0] % 64 for s in starts)


def test_buffers_are_reused_and_grown():
    staging = Staging("cpu", pin=False)
    small = staging.to_device_tensors([torch.arange(10)])[0]
    again = staging.to_device_tensors([torch.arange(20), None])
    assert again[1] is None and again[0].data_ptr() == small.data_ptr()  # same buffer
    big = staging.to_device_tensors([torch.arange(100_000)])[0]
    assert torch.equal(big, torch.arange(100_000))
    # The buffer was replaced by a larger one; the earlier views keep their own (old) storage.
    assert big.untyped_storage().nbytes() >= 800_000 > small.untyped_storage().nbytes()


@pytest.mark.gpu
def test_a_gpu_predictor_stages_through_pinned_memory_and_scores_as_on_cpu(tmp_path):
    path = export_package(
        tmp_path / "p",
        model_config=CFG,
        state_dict=trained_state(CFG),
        devices=["cuda:0"],
        accuracy_sample=synthetic_sample(CFG, 256),
    )
    on_gpu = Predictor.load(path, device="cuda:0", dense_dtype="fp32")
    on_cpu = Predictor.load(path, device="cpu", dense_dtype="fp32")
    for batch in (16, 512, 16):  # grows, then reuses
        dense, kjt = request(CFG, batch=batch)
        torch.testing.assert_close(
            on_gpu.predict(dense, kjt), on_cpu.predict(dense, kjt), atol=1e-5, rtol=1e-4
        )
    assert on_gpu._staging is not None and on_gpu._staging.pin
    # After the warm-up, a predict waits for the GPU once: reading its scores back.
    dense, kjt = request(CFG, batch=512)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning, match="synchroniz") as caught:
            on_gpu.predict(dense, kjt, checked=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1, [str(w.message) for w in caught]
