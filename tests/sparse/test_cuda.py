"""The same operations on a CUDA device give the same results as on the CPU."""

import pytest
import torch

from rectrain.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor, jt_is_equal, kjt_is_equal

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


def vbe_kjt(device: torch.device | str = "cpu") -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=torch.arange(7, device=device),
        weights=torch.arange(7, dtype=torch.float32, device=device),
        lengths=torch.tensor([2, 0, 1, 3, 0, 1], device=device),
        stride_per_key_per_rank=[[2, 1], [0, 1], [1, 1]],
    )


def test_jagged_tensor_round_trips_through_cuda():
    jt = JaggedTensor(values=torch.arange(6.0), lengths=torch.tensor([2, 3, 1]), weights=torch.ones(6))
    on_gpu = jt.to(CUDA)
    assert on_gpu.device().type == "cuda" and on_gpu.offsets().device.type == "cuda"
    assert torch.equal(on_gpu.to_padded_dense().cpu(), jt.to_padded_dense())
    assert jt_is_equal(on_gpu.to("cpu"), jt)


def test_kjt_permute_split_concat_on_cuda_match_cpu():
    cpu, gpu = vbe_kjt(), vbe_kjt(CUDA)
    assert kjt_is_equal(gpu.permute([2, 0]).to("cpu"), cpu.permute([2, 0]))
    parts = gpu.split([1, 2])
    assert all(p.device().type == "cuda" for p in parts)
    assert kjt_is_equal(KeyedJaggedTensor.concat(parts).to("cpu"), cpu)
    assert jt_is_equal(gpu["b"].to("cpu"), cpu["b"])


def test_validation_on_cuda_reports_numbers():
    jt = JaggedTensor(values=torch.arange(6, device=CUDA), lengths=torch.tensor([2, 3, 2], device=CUDA))
    with pytest.raises(ValueError, match="lengths sum to 7 but values has 6 elements"):
        jt.validate()


def test_pin_memory_and_non_blocking_copy():
    pinned = vbe_kjt().pin_memory()
    assert pinned.values().is_pinned()
    on_gpu = pinned.to(CUDA, non_blocking=True)
    on_gpu.record_stream(torch.cuda.current_stream())
    assert kjt_is_equal(on_gpu.to("cpu"), vbe_kjt())


def test_keyed_tensor_regroup_on_cuda():
    kt = KeyedTensor(["a", "b"], [1, 2], torch.arange(6.0).view(2, 3)).to(CUDA)
    (out,) = KeyedTensor.regroup([kt], [["b", "a"]])
    assert out.device.type == "cuda" and out.cpu().tolist() == [[1, 2, 0], [4, 5, 3]]
