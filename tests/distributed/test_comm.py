"""Every collective, forward and backward, against a single-process computation of the same global math.

Each rank builds every rank's inputs from a seeded generator, so it can compute the whole global result (and,
through autograd, the gradient of a global loss) locally and compare its own share with what the collective
produced. One spawned job per world size runs all checks (spawning a group costs seconds).
"""

from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor

from rectrain.distributed import ShardingEnv
from rectrain.distributed.comm.ops import (
    all_gather_v,
    all_to_all_single,
    alltoall_pooled,
    exchange_splits,
)
from rectrain.distributed.comm.pending import Pending
from tests.distributed.multiprocess import run_multiprocess


def _rand(owner: int, tag: int, *shape: int, device: torch.device) -> Tensor:
    """The same tensor on every rank: owner's input number ``tag``."""
    gen = torch.Generator().manual_seed(1000 * owner + tag)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)


def _check_forward_backward(
    env: ShardingEnv,
    inputs: Sequence[Tensor],
    distributed: Callable[[Tensor], Tensor],
    global_math: Callable[[list[Tensor]], list[Tensor]],
    tag: int,
) -> None:
    """Compare this rank's output and input gradient with the single-process global computation.

    The loss is sum_r <out_r, w_r> with a random w_r per rank, so every output element gets a distinct weight;
    the single-process reference takes its mean over ranks (the backward divides by the world size, as
    TorchRec's does by default).
    """
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    expected = global_math(leaves)
    weights = [_rand(r, tag + 500, *out.shape, device=out.device) for r, out in enumerate(expected)]
    (sum((out * w).sum() for out, w in zip(expected, weights)) / env.world_size).backward()

    mine = inputs[env.rank].clone().requires_grad_(True)
    out = distributed(mine)
    torch.testing.assert_close(out, expected[env.rank].detach())
    (out * weights[env.rank]).sum().backward()
    torch.testing.assert_close(mine.grad, leaves[env.rank].grad)


def _offsets(splits: Sequence[int]) -> list[int]:
    return [sum(splits[:i]) for i in range(len(splits) + 1)]


def _a2a_global(splits: list[list[int]]) -> Callable[[list[Tensor]], list[Tensor]]:
    """Rows splits[s][d] of rank s's input go to rank d; each output lists its sources in rank order."""

    def math(xs: list[Tensor]) -> list[Tensor]:
        offs = [_offsets(s) for s in splits]
        n = len(xs)
        return [torch.cat([xs[s][offs[s][d] : offs[s][d + 1]] for s in range(n)]) for d in range(n)]

    return math


def _check_all_to_all(env: ShardingEnv, device: torch.device) -> None:
    n, me = env.world_size, env.rank
    splits = [[(3 * s + 2 * d) % 4 for d in range(n)] for s in range(n)]  # contains zeros
    assert exchange_splits([splits[me], [2 * x for x in splits[me]]]) == [
        [splits[s][me] for s in range(n)],
        [2 * splits[s][me] for s in range(n)],
    ]
    inputs = [_rand(s, 1, sum(splits[s]), 3, device=device) for s in range(n)]
    out_splits = [splits[s][me] for s in range(n)]
    _check_forward_backward(
        env, inputs, lambda x: all_to_all_single(x, out_splits, splits[me]), _a2a_global(splits), tag=1
    )


def _check_alltoall_pooled(env: ShardingEnv, device: torch.device) -> None:
    n = env.world_size
    batch = [2, 0, 3][:n]  # rank 1 has an empty batch
    dims = [3, 5, 0][:n] if n == 3 else [3, 1]  # rank 2 owns no columns

    def math(xs: list[Tensor]) -> list[Tensor]:
        rows = _offsets(batch)
        return [torch.cat([x[rows[d] : rows[d + 1]] for x in xs], dim=1) for d in range(n)]

    inputs = [_rand(s, 2, sum(batch), dims[s], device=device) for s in range(n)]
    _check_forward_backward(env, inputs, lambda x: alltoall_pooled(x, batch, dims), math, tag=2)


def _check_all_gather(env: ShardingEnv, device: torch.device) -> None:
    n, me = env.world_size, env.rank

    def math(xs: list[Tensor]) -> list[Tensor]:
        return [torch.cat(xs) for _ in range(n)]

    for tag, sizes, pass_sizes in [(5, [1, 3, 0][:n], True), (6, [0, 2, 1][:n], False), (7, [2] * n, False)]:
        inputs = [_rand(s, tag, sizes[s], 2, device=device) for s in range(n)]
        known = sizes if pass_sizes else None
        _check_forward_backward(env, inputs, lambda x, known=known: all_gather_v(x, known), math, tag=tag)
    assert all_gather_v(torch.tensor([me], device=device), [1] * n).tolist() == list(range(n))


def _check_async(env: ShardingEnv, device: torch.device) -> None:
    """Several collectives in flight at once, waited out of order, give the synchronous results."""
    n, me = env.world_size, env.rank
    splits = [[(s + d) % 3 for d in range(n)] for s in range(n)]
    x = _rand(me, 8, sum(splits[me]), 2, device=device)
    out_splits = [splits[s][me] for s in range(n)]
    pooled = _rand(me, 9, 2 * n, 3, device=device)
    first = all_to_all_single(x, out_splits, splits[me], async_op=True)
    second = alltoall_pooled(pooled, [2] * n, [3] * n, async_op=True)
    third = all_gather_v(x, async_op=True)
    assert isinstance(first, Pending) and not first.done
    busy = torch.randn(64, 64, device=device) @ torch.randn(64, 64, device=device)  # overlapped local work
    assert busy.shape == (64, 64)
    assert torch.equal(third.wait(), all_gather_v(x))
    assert torch.equal(second.wait(), alltoall_pooled(pooled, [2] * n, [3] * n))
    assert torch.equal(first.wait(), all_to_all_single(x, out_splits, splits[me]))
    assert first.done and first.wait() is first.wait()


def _check_errors(env: ShardingEnv, device: torch.device) -> None:
    """Bad splits are rejected before any communication, with the numbers in the message."""
    n = env.world_size
    x = torch.zeros(10, 2, device=device)
    bad = [9] + [0] * (n - 1)
    with pytest.raises(ValueError, match=r"input_split_sizes \[9, 0.*\] sum to 9 but tensor's dim 0 is 10"):
        all_to_all_single(x, [1] * n, bad)
    with pytest.raises(ValueError, match=rf"input_split_sizes has 1 entries but the process group has {n}"):
        all_to_all_single(x, [1] * n, [10])
    with pytest.raises(ValueError, match=r"expects a .* = \[4, 3\] tensor on rank .*, got \[4, 2\]"):
        alltoall_pooled(torch.zeros(4, 2, device=device), [2, 2] + [0] * (n - 2), [3] * n)
    with pytest.raises(ValueError, match=r"must be non-negative"):
        all_gather_v(x, [10, -1] + [0] * (n - 2))


def _run_all_checks(env: ShardingEnv, device_type: str) -> int:
    device = torch.device(device_type, torch.cuda.current_device() if device_type == "cuda" else None)
    _check_all_to_all(env, device)
    _check_alltoall_pooled(env, device)
    _check_all_gather(env, device)
    _check_async(env, device)
    _check_errors(env, device)
    return env.rank


@pytest.mark.parametrize("world_size", [2, 3])
def test_collectives_match_single_process_math(world_size):
    assert run_multiprocess(_run_all_checks, world_size, "cpu") == list(range(world_size))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank")
def test_collectives_match_single_process_math_on_nccl():
    assert run_multiprocess(_run_all_checks, 2, "cuda", backend="nccl") == [0, 1]


def _gradients_with_and_without_division(env: ShardingEnv) -> list[Tensor]:
    from rectrain.distributed.comm_ops import get_gradient_division, set_gradient_division

    grads = []
    default = get_gradient_division()
    for divide in (False, True):
        set_gradient_division(divide)
        assert get_gradient_division() is divide
        x = torch.full((env.world_size, 2), float(env.rank + 1), requires_grad=True)
        out = all_to_all_single(x, [1] * env.world_size, [1] * env.world_size)
        (out * 3).sum().backward()
        grads.append(x.grad)
    set_gradient_division(default)
    return grads


def _default_gradient_division(env: ShardingEnv) -> bool:
    from rectrain.distributed.comm_ops import get_gradient_division

    return get_gradient_division()


def test_gradient_division_is_on_by_default_as_in_torchrec():
    assert run_multiprocess(_default_gradient_division, 2) == [True, True]


def test_gradient_division_divides_the_backward_by_the_world_size():
    # TorchRec's comm_ops switch: the gradient of the mean of the ranks' losses instead of their sum.
    for plain, divided in run_multiprocess(_gradients_with_and_without_division, 2):
        assert torch.equal(plain, torch.full((2, 2), 3.0)) and torch.equal(divided, torch.full((2, 2), 1.5))


def _all_gather_base_pooled(env: ShardingEnv) -> tuple[Tensor, Tensor]:
    from rectrain.distributed import comm_ops

    mine = torch.full((2, 3), float(env.rank + 1), requires_grad=True)
    gathered = comm_ops.all_gather_base_pooled(mine, env.pg).wait()
    (gathered * torch.arange(4.0).view(4, 1)).sum().backward()
    return gathered.detach(), mine.grad


def test_all_gather_base_pooled_is_the_even_all_gather_under_torchrec_name():
    for rank, (gathered, grad) in enumerate(run_multiprocess(_all_gather_base_pooled, 2)):
        assert torch.equal(gathered, torch.tensor([[1.0] * 3] * 2 + [[2.0] * 3] * 2))
        # Backward: each rank's rows' weights summed over both ranks, then divided by the world size.
        assert torch.equal(grad, torch.arange(4.0).view(4, 1)[2 * rank : 2 * rank + 2].expand(2, 3) * 2 / 2)
