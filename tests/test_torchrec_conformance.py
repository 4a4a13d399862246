"""scripts/torchrec_conformance.py changes only the imports of the TorchRec code it runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "torchrec_conformance.py"
spec = importlib.util.spec_from_file_location("torchrec_conformance", SCRIPT)
conformance = importlib.util.module_from_spec(spec)
spec.loader.exec_module(conformance)


def test_imports_are_rewritten_and_nothing_else():
    source = "\n".join(
        [
            "import torchrec",
            "import torchrec.optim as trec_optim",
            "from torchrec.optim.keyed import KeyedOptimizer",
            "from torchrec import inference as trec_infer",
            "    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor",
            "x = torchrec.optim.RowWiseAdagrad  # torchrec stays in code and comments",
        ]
    )
    assert conformance.rewrite(source, "rectrain").splitlines() == [
        "import rectrain; import rectrain as torchrec",
        "import rectrain.optim as trec_optim",
        "from rectrain.optim.keyed import KeyedOptimizer",
        "from rectrain import inference as trec_infer",
        "    from rectrain.sparse.jagged_tensor import KeyedJaggedTensor",
        "x = torchrec.optim.RowWiseAdagrad  # torchrec stays in code and comments",
    ]
    assert conformance.rewrite(source, "torchrec") == source


def test_mock_patch_targets_follow_the_imports():
    source = 'with patch("torchrec.modules.hash_mc_metrics.time") as t, patch.object(x, "torchrec.y"):'
    assert conformance.rewrite(source, "rectrain") == (
        'with patch("rectrain.modules.hash_mc_metrics.time") as t, patch.object(x, "torchrec.y"):'
    )


def test_module_loggers_a_test_listens_on_follow_the_imports():
    source = 'with self.assertLogs(\n    "torchrec.sparse.jagged_tensor_validator", level="WARNING"):'
    assert conformance.rewrite(source, "rectrain") == (
        'with self.assertLogs(\n    "rectrain.sparse.jagged_tensor_validator", level="WARNING"):'
    )


def test_the_measure_counts_the_tests_passing_under_torchrec_that_pass_here(tmp_path):
    for relative in (
        "torchrec/optim/tests/test_keyed.py",  # issue 36's list: not in the measure
        "torchrec/distributed/planner/tests/test_types.py",  # the planner's: issue 44 counts them
        "torchrec/distributed/test_utils/test_model.py",  # a helper module
        "torchrec/sparse/tests/test_jagged_tensor.py",
        "torchrec/schema/api_tests/test_optimizer_schema.py",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    assert conformance.other_test_files(tmp_path) == [
        "torchrec/schema/api_tests/test_optimizer_schema.py",
        "torchrec/sparse/tests/test_jagged_tensor.py",
    ]
    reference = {"files": {"a.py": {"passed": ["T::x", "T::y"]}, "b.py": {"passed": ["T::z"]}, "c.py": {}}}
    results = [{"file": "a.py", "passing": ["T::x", "T::extra"]}]  # b.py not run: its test counts as failed
    assert conformance.score(reference, results) == (1, 3)
