"""TorchRec's retrieval example with ``save_dir``, ported (imports only), then its saved model served.

Run as ``python two_tower_example_job.py <torchrec source tree> <work dir>`` under ``torchrun`` (one rank,
gloo). The example trains under ``DistributedModelParallel``, calls
``inference.modules.quantize_embeddings(model, dtype=torch.qint8, inplace=True)`` and saves
``torch.save(quant_model.state_dict(), "<save_dir>/model.pt")``; the job records what that call returned
(the in-process model) by wrapping the real function. recserve never unpickles ``model.pt``: the state it
holds is exported from memory instead, gathered unsharded as the example's ``two_tower_train_cpu`` does.
Then, in this process:

- the float in-process model (the DMP model: its collection is sharded, so it stays float, as in TorchRec)
  scores a batch; its gathered state exported at fp32 and served by ``Predictor`` scores it too;
- the same model gathered unsharded and quantized in process (``quantize_embeddings`` on the unsharded
  model) scores it; the gathered state exported at int8, and that quantized module exported as it is,
  score it too.

Writes ``result.json`` in the work dir: the largest score differences and what was saved.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _port_example(src: Path, work: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "torchrec_conformance", ROOT / "scripts" / "torchrec_conformance.py"
    )
    conformance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conformance)
    conformance.copy_rewritten(src / "examples" / "retrieval", work / "retrieval", "rectrain")
    (work / "retrieval" / "__init__.py").touch()
    # faiss is not installed here: the index is built by plain objects and written as an empty file.
    faiss = sys.modules.setdefault("faiss", types.ModuleType("faiss"))
    faiss.GpuIndexIVFPQ = faiss.IndexIVFPQ = object
    faiss.write_index = lambda index, path: Path(path).write_bytes(b"")
    sys.modules.setdefault("faiss.contrib", types.ModuleType("faiss.contrib"))
    sys.modules.setdefault("faiss.contrib.torch_utils", types.ModuleType("faiss.contrib.torch_utils"))
    sys.path.insert(0, str(work))


def _two_tower_config(num_embeddings: int, dim: int, layer_sizes: list[int]):
    from rectrain.embedding import EmbeddingBagConfig
    from rectrain.models.config import ModelConfig

    tables = [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=num_embeddings, embedding_dim=dim, feature_names=[f])
        for f in ("userId", "movieId")
    ]
    return ModelConfig(kind="two_tower", tables=tables, dense_in_features=0, tower_layer_sizes=layer_sizes)


def main(src: Path, work: Path) -> None:
    _port_example(src, work)
    import retrieval.two_tower_train as example
    from retrieval.modules.two_tower import TwoTower, TwoTowerTrainTask

    from recserve.export import export_package
    from recserve.export.torchrec_import import import_module
    from recserve.runtime import Predictor
    from rectrain.datasets.utils import Batch
    from rectrain.embedding import EmbeddingBagCollection
    from rectrain.inference import modules as inference_modules
    from rectrain.inference.state_dict_transform import state_dict_gather, state_dict_to_device
    from rectrain.sparse import KeyedJaggedTensor

    example.get_index = lambda **kwargs: types.SimpleNamespace(train=lambda x: None, add=lambda x: None)
    returned = []
    quantize = inference_modules.quantize_embeddings

    def recording_quantize(*args, **kwargs):
        returned.append(quantize(*args, **kwargs))
        return returned[-1]

    inference_modules.quantize_embeddings = recording_quantize
    rows, dim, layers = 1000, 16, [32, 16]
    save_dir = work / "saved"
    save_dir.mkdir()
    # The example's towers end in a ReLU: from some initial states every tower output is 0 and so is every
    # score, which would make the comparisons below vacuous. This seed gives scores that differ.
    torch.manual_seed(0)
    example.train(
        num_embeddings=rows, embedding_dim=dim, layer_sizes=layers, num_iterations=20, save_dir=str(save_dir)
    )
    inference_modules.quantize_embeddings = quantize
    (in_process,) = returned

    gen = torch.Generator().manual_seed(5)
    batch_size = 64
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["userId", "movieId"],
        values=torch.randint(0, rows, (2 * batch_size,), generator=gen),
        lengths=torch.ones(2 * batch_size, dtype=torch.int32),
    )
    batch = Batch(
        dense_features=torch.zeros(batch_size, 0), sparse_features=kjt, labels=torch.zeros(batch_size)
    )
    with torch.no_grad():
        float_logits = in_process(batch)[1][1]

    # The example's unsharded CPU model, gathered as the example gathers it, quantized in process.
    cfg = _two_tower_config(rows, dim, layers)
    cpu_task = TwoTowerTrainTask(TwoTower(EmbeddingBagCollection(tables=list(cfg.tables)), layers))
    state = state_dict_to_device(
        in_process.state_dict(), pg=torch.distributed.group.WORLD, device=torch.device("cpu")
    )
    state_dict_gather(state, cpu_task.state_dict())
    quantized_task = inference_modules.quantize_embeddings(cpu_task, dtype=torch.qint8, inplace=False)
    with torch.no_grad():
        quantized_logits = quantized_task(batch)[1][1]

    imported_cfg, imported = import_module(cfg, cpu_task)
    served = {}
    for dtype in ("fp32", "int8"):
        package = export_package(
            work / f"pkg_{dtype}", model_config=imported_cfg, state_dict=imported, dtype=dtype, force=True
        )
        served[dtype] = Predictor.load(package).predict_logits(torch.zeros(batch_size, 0), kjt)
    package = export_package(
        work / "pkg_quantized_module", model_config=cfg, model=quantized_task, force=True
    )
    served["quantized_module"] = Predictor.load(package).predict_logits(torch.zeros(batch_size, 0), kjt)
    manifest = json.loads((package / "manifest.json").read_text())

    quantized_type = type(quantized_task.two_tower.ebc)
    result = {
        "saved": sorted(p.name for p in save_dir.iterdir()),
        "in_process_type": type(in_process).__name__,
        "quantized_type": f"{quantized_type.__module__}.{quantized_type.__name__}",
        "quantized_module_table_dtypes": [t["dtype"] for t in manifest["tables"]],
        "fp32_vs_float_model": (served["fp32"] - float_logits).abs().max().item(),
        "int8_vs_quantized_model": (served["int8"] - quantized_logits).abs().max().item(),
        "quantized_module_vs_quantized_model": (served["quantized_module"] - quantized_logits)
        .abs()
        .max()
        .item(),
        "quantized_vs_float_model": (quantized_logits - float_logits).abs().max().item(),
        "float_logit_range": (float_logits.max() - float_logits.min()).item(),
    }
    (work / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
