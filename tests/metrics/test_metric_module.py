"""``RecMetricModule`` (TorchRec's API): tasks, lifetime and window values, checkpoints, ranks."""

from __future__ import annotations

import pytest
import torch

from rectrain.metrics.functional import auc, normalized_entropy
from rectrain.metrics.metric_module import RecMetricModule, generate_metric_module
from rectrain.metrics.metrics_config import MetricsConfig, RecMetricDef, RecMetricEnum, RecTaskInfo
from tests.distributed.multiprocess import run_multiprocess

TASKS = [
    RecTaskInfo(name=n, label_name=f"{n}_label", prediction_name=f"{n}_pred", weight_name=f"{n}_w")
    for n in ("click", "like")
]
BATCH = 32


def _module(world_size: int = 1, rank: int = 0, window_batches: int = 2) -> RecMetricModule:
    window = RecMetricDef(rec_task_indices=[0, 1], window_size=window_batches * BATCH * world_size)
    config = MetricsConfig(
        rec_tasks=TASKS,
        rec_metrics={RecMetricEnum.NE: window, RecMetricEnum.AUC: window, RecMetricEnum.CTR: window},
        compute_interval_steps=3,
    )
    return generate_metric_module(RecMetricModule, config, BATCH, world_size, rank, {}, torch.device("cpu"))


def _batches(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        batch = {}
        for task in TASKS:
            labels = (torch.rand(BATCH, generator=g) < 0.4).double()
            batch[task.label_name] = labels
            batch[task.prediction_name] = 0.4 * labels + 0.6 * torch.rand(
                BATCH, generator=g, dtype=torch.double
            )
            batch[task.weight_name] = torch.ones(BATCH, dtype=torch.double)
        out.append(batch)
    return out


def _cat(batches: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    return torch.cat([b[key] for b in batches])


def test_tasks_have_lifetime_and_window_values_of_their_own_examples():
    batches, module = _batches(5, 0), _module()
    for batch in batches:
        module.update(batch)
    assert not module.should_compute()  # 5 batches, computed every 3rd
    values = module.compute()
    for task in TASKS:
        p, y = _cat(batches, task.prediction_name), _cat(batches, task.label_name)
        ne = values[f"ne-{task.name}|lifetime_ne"]
        assert float(ne) == pytest.approx(normalized_entropy(p, y), rel=1e-9)
        window_ne = values[f"ne-{task.name}|window_ne"]
        assert float(window_ne) == pytest.approx(normalized_entropy(p[-64:], y[-64:]), rel=1e-9)
        assert float(values[f"auc-{task.name}|window_auc"]) == pytest.approx(auc(p[-64:], y[-64:]), abs=1e-6)
        assert float(values[f"ctr-{task.name}|lifetime_ctr"]) == pytest.approx(float(y.mean()))


def test_a_checkpoint_restores_the_lifetime_sums():
    module = _module()
    for batch in _batches(3, 1):
        module.update(batch)
    restored = _module()
    restored.load_state_dict(module.state_dict())
    key = "ne-click|lifetime_ne"
    assert float(restored.compute()[key]) == float(module.compute()[key])


def test_a_metric_rectrain_lacks_is_refused_by_name():
    config = MetricsConfig(rec_tasks=TASKS, rec_metrics={RecMetricEnum.NDCG: RecMetricDef(rec_tasks=TASKS)})
    with pytest.raises(ValueError, match="rec_metrics: ndcg is not implemented"):
        generate_metric_module(RecMetricModule, config, BATCH, 1, 0, {}, torch.device("cpu"))


def _rank_values(env, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    module = _module(world_size=2, rank=env.rank)
    for batch in batches[env.rank :: 2]:  # rank 0: batches 0, 2, 4; rank 1: 1, 3, 5
        module.update(batch)
    return {k: float(v) for k, v in module.compute().items()}


def test_two_ranks_compute_over_the_union_of_their_batches():
    batches = _batches(6, 2)
    rank0, rank1 = run_multiprocess(_rank_values, 2, batches)
    assert rank1 == {}  # values on rank 0 only (compute_on_all_ranks=False)
    for task in TASKS:
        p, y = _cat(batches, task.prediction_name), _cat(batches, task.label_name)
        assert rank0[f"ne-{task.name}|lifetime_ne"] == pytest.approx(normalized_entropy(p, y), rel=1e-9)
        # each rank's latest 2 batches: 2 and 4 on rank 0, 3 and 5 on rank 1
        assert rank0[f"auc-{task.name}|window_auc"] == pytest.approx(auc(p[64:], y[64:]), abs=1e-6)
        assert rank0[f"ne-{task.name}|window_ne"] == pytest.approx(
            normalized_entropy(p[64:], y[64:]), rel=1e-9
        )
