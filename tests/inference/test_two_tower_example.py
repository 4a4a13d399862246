"""TorchRec's retrieval example with ``save_dir`` runs to the end ported, and recserve serves what it saved.

The example (``examples/retrieval/two_tower_train.py`` of a TorchRec 1.8.0 source tree named by
``RECTRAIN_TORCHREC_SRC``; none of TorchRec's code is in this repository) runs on one gloo rank with only
its imports changed (``two_tower_example_job.py``). Its ``quantize_embeddings`` call gets the DMP model, whose
collection is sharded and so stays float (as in TorchRec, whose ``model.pt`` holds the float
``ShardedTensor`` tables too). recserve never unpickles ``model.pt``; the state it holds, gathered
unsharded from the example's model in memory, is what is exported. Scores:

- exported at fp32 and served: equal to the in-process (float, sharded) model;
- exported at int8 and served: equal to the example's model gathered unsharded and quantized
  in process with ``quantize_embeddings`` (same row-wise quantization, same FBGEMM kernel);
- that quantized module exported as it is (its int8 rows copied, not re-quantized): equal to it as well.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("two_tower_example_job.py")


def _torchrec_src() -> Path:
    src = os.environ.get("RECTRAIN_TORCHREC_SRC")
    if not src or not (Path(src) / "examples" / "retrieval" / "two_tower_train.py").is_file():
        pytest.skip(
            "set RECTRAIN_TORCHREC_SRC to a TorchRec 1.8.0 source tree (git clone --branch release/v1.8.0)"
        )
    if importlib.util.find_spec("click") is None:
        pytest.skip("TorchRec's example imports click: install it or put a folder holding it on PYTHONPATH")
    return Path(src)


@pytest.mark.slow
def test_two_tower_train_with_save_dir_is_served_with_the_in_process_scores(tmp_path):
    src = _torchrec_src()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    done = subprocess.run(
        [*launch, str(JOB), str(src), str(tmp_path)], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["saved"] == ["faiss.index", "model.pt"]
    assert result["in_process_type"] == "DistributedModelParallel"
    assert result["quantized_type"] == "rectrain.quant.embedding_modules.EmbeddingBagCollection"
    assert result["quantized_module_table_dtypes"] == ["int8", "int8"]
    assert result["fp32_vs_float_model"] <= 1e-6
    assert result["int8_vs_quantized_model"] <= 1e-6
    assert result["quantized_module_vs_quantized_model"] <= 1e-6
    # The scores differ between examples (the comparisons above are not of constant scores), and int8 rows
    # move them a little (they are not of identical float models either).
    assert result["float_logit_range"] > 0
    assert 0 < result["quantized_vs_float_model"] <= 0.05 * result["float_logit_range"]
