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
