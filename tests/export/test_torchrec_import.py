"""Importing models trained with TorchRec: DCP checkpoints (restricted metadata unpickling, chunk assembly),
safetensors state dicts, modules in memory, and a real TorchRec DLRM trained on 2 ranks, exported, served."""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from recserve.cli import main as recserve_main
from recserve.client import PredictorClient
from recserve.errors import ExportError
from recserve.export import export_package
from recserve.export.dcp_reader import DcpCheckpoint, read_metadata
from recserve.export.torchrec_import import import_state_dict, load_torchrec, read_model_config
from recserve.runtime import Predictor
from recserve.runtime.package import read_manifest
from rectrain.models import DLRMTrain, build_model
from rectrain.sparse import KeyedJaggedTensor
from tests.distributed.multiprocess import run_multiprocess

from .common import dlrm_config, fp32_logits, request, trained_state
from .torchrec_fixtures import (
    ROOT,
    run_torchrec_job,
    save_sharded_dlrm,
    torchrec_two_tower_logits,
    torchrec_two_tower_state,
    two_tower_config,
)


class _Evil:
    """Unpickling this runs ``call(*args)``: what a malicious metadata file would do."""

    def __init__(self, call, *args) -> None:
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


@pytest.mark.parametrize("call", [os.system, eval], ids=["os.system", "builtins.eval"])
def test_metadata_with_a_foreign_global_is_refused_before_it_runs(tmp_path, capsys, call):
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    marker = tmp_path / "ran"
    payload = f"touch {marker}" if call is os.system else f"open({str(marker)!r}, 'w')"
    # A genuine Metadata with the payload buried inside, as a tampered checkpoint would carry it.
    metadata = Metadata(state_dict_metadata={}, storage_meta=StorageMeta(checkpoint_id=_Evil(call, payload)))
    (tmp_path / ".metadata").write_bytes(pickle.dumps(metadata))
    name = f"{call.__module__}.{call.__name__}"  # posix.system on Linux
    with pytest.raises(ExportError, match=rf"refusing to unpickle global {re.escape(name)}"):
        read_metadata(tmp_path)
    assert not marker.exists()

    cfg_file = tmp_path / "model.json"
    cfg_file.write_text(json.dumps(dlrm_config().to_dict()))
    argv = ["export", "--from-torchrec", str(tmp_path), "--model-config", str(cfg_file), "--out", "x"]
    assert recserve_main(argv) == 2
    assert "refusing to unpickle global" in capsys.readouterr().err and not marker.exists()


def test_no_unrestricted_unpickling_in_the_sources():
    """``pickle.load(s)`` and ``torch.load`` without ``weights_only=True`` appear nowhere in our packages."""
    offenders = []
    for package in ("recserve", "rectrain"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            if re.search(r"\bpickle\.loads?\(|\bcPickle\b|\bdill\b", text):
                offenders.append(f"{path}: pickle.load")
            for match in re.finditer(r"\btorch\.load\(", text):
                call = _call_arguments(text, match.end())
                if not re.search(r"weights_only\s*=\s*True", call):
                    offenders.append(f"{path}: torch.load({call})")
    assert offenders == []


def _call_arguments(text: str, start: int) -> str:
    """The text between the parenthesis opened just before ``start`` and the one that closes it."""
    depth = 1
    for end in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end]
    return text[start:]


@pytest.mark.slow
def test_dcp_checkpoint_of_any_sharding_exports_to_torchrecs_scores(tmp_path):
    """Row-wise, column-wise, grid and replicated tables over 2 ranks, optimizer state beside them, a
    non-tensor entry: each table comes back whole and the fp32 package scores exactly as the model."""
    in_memory = run_multiprocess(save_sharded_dlrm, 2, str(tmp_path / "ckpt"))
    assert all("ShardedTensor with shards on other ranks" in message for message in in_memory), in_memory
    cfg, state = dlrm_config(), trained_state(dlrm_config())
    checkpoint = DcpCheckpoint(tmp_path / "ckpt")
    assert checkpoint.skipped == ["step"]
    fqn = "model.model.sparse_arch.embedding_bag_collection.embedding_bags.t2.weight"
    assert len(checkpoint.entries[fqn].chunks) == 4
    assert torch.equal(checkpoint.read([fqn])[fqn], state[fqn[len("model.") :]])

    imported_cfg, imported, source = load_torchrec(tmp_path / "ckpt", cfg)
    assert imported_cfg == cfg and imported.keys() == state.keys()
    assert all(torch.equal(imported[k], state[k]) for k in state)
    assert source["format"] == "torch.distributed.checkpoint"

    path = export_package(tmp_path / "pkg", model_config=cfg, state_dict=imported, dtype="fp32")
    dense, kjt = request(cfg, 16)
    served = Predictor.load(path).predict_logits(dense, kjt)
    assert torch.equal(served, fp32_logits(cfg, state, dense, kjt))


def test_incomplete_or_tampered_dcp_checkpoint_is_refused(tmp_path):
    from torch.distributed.checkpoint import save

    save({"model": {"w": torch.ones(4, 2)}}, checkpoint_id=str(tmp_path))
    data = next(tmp_path.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:10])
    with pytest.raises(ExportError, match=r"byte range .* is outside"):
        DcpCheckpoint(tmp_path)
    data.unlink()
    with pytest.raises(ExportError, match=r"data file .* is missing"):
        DcpCheckpoint(tmp_path)


def test_dcp_written_in_safetensors_format_reads_back(tmp_path):
    from torch.distributed.checkpoint import FileSystemWriter, save
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    state = {"w": torch.randn(5, 3), "b": torch.arange(4, dtype=torch.int64)}
    writer = FileSystemWriter(str(tmp_path), serialization_format=SerializationFormat.SAFETENSORS)
    save({"model": state}, storage_writer=writer)
    read = DcpCheckpoint(tmp_path).read(["model.w", "model.b"])
    assert torch.equal(read["model.w"], state["w"]) and torch.equal(read["model.b"], state["b"])


def test_metadata_of_admitted_classes_with_wrong_contents_is_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    (tmp_path / ".metadata").write_bytes(
        pickle.dumps(Metadata(state_dict_metadata=["not", "a", "dict"], storage_data={}))
    )
    with pytest.raises(ExportError, match="malformed DCP metadata"):
        DcpCheckpoint(tmp_path)
    (tmp_path / ".metadata").write_bytes(b"\x80\x04garbage")
    with pytest.raises(ExportError, match="not a readable DCP metadata file"):
        DcpCheckpoint(tmp_path)


def test_torchrec_two_tower_safetensors_serves_torchrecs_scores(tmp_path):
    """TorchRec's towers end in a ReLU: the import appends an identity layer so the scores stay exact."""
    cfg = two_tower_config()
    state = torchrec_two_tower_state(cfg)
    save_file(state, str(tmp_path / "two_tower.safetensors"))
    imported_cfg, imported, source = load_torchrec(tmp_path / "two_tower.safetensors", cfg)
    assert imported_cfg.tower_layer_sizes == [16, 8, 8] and source["format"] == "safetensors"
    path = export_package(tmp_path / "pkg", model_config=imported_cfg, state_dict=imported, dtype="fp32")
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 4, (2 * 12,), generator=gen)
    values = torch.cat(
        [torch.randint(0, 50, (int(lengths[:12].sum()),)), torch.randint(0, 80, (int(lengths[12:].sum()),))]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["user", "item"], values=values, lengths=lengths)
    served = Predictor.load(path).predict_logits(torch.zeros(12, 0), kjt)
    assert torch.allclose(served, torchrec_two_tower_logits(cfg, state, kjt), rtol=0, atol=1e-6)


_WRAPPERS = ["model.", "_dmp_wrapped_module.", "module.", "_orig_mod.", "two_tower."]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(_WRAPPERS), max_size=4))
def test_wrapper_prefixes_and_optimizer_entries_are_dropped(wrappers):
    """DCP's top-level key, DLRMTrain, DMP, DDP, torch.compile wrap the model: its keys come back as ours."""
    prefix, expected = "".join(wrappers), _trained_dlrm_state()
    arch = {key[len("model.") :]: value for key, value in expected.items()}  # a bare TorchRec DLRM's keys
    wrapped = {prefix + key: value for key, value in arch.items()}
    table_key = "sparse_arch.embedding_bag_collection.embedding_bags.t0.weight"
    wrapped[f"optim.state.{table_key}.t0.momentum1"] = torch.zeros(1)
    wrapped["step"] = torch.tensor(3)
    cfg, state = import_state_dict(dlrm_config(), wrapped)
    assert cfg == dlrm_config() and state.keys() == expected.keys()
    assert all(torch.equal(state[key], expected[key]) for key in state)


@functools.cache
def _trained_dlrm_state() -> dict[str, torch.Tensor]:
    return trained_state(dlrm_config())


def test_export_package_takes_a_module_in_memory(tmp_path):
    """A DLRMTrain(DLRM) in TorchRec's layout (ours has TorchRec's keys) exports as its prediction module."""
    cfg = dlrm_config()
    torch.manual_seed(0)
    train = DLRMTrain(build_model(cfg).model)
    path = export_package(tmp_path / "pkg", model_config=cfg, model=train, dtype="fp32")
    dense, kjt = request(cfg, 8)
    with torch.no_grad():
        expected = train.model(dense, kjt).squeeze(-1)
    assert torch.equal(Predictor.load(path).predict_logits(dense, kjt), expected)
    with pytest.raises(ExportError, match="exactly one of state_dict= and model="):
        export_package(tmp_path / "x", model_config=cfg, model=train, state_dict=train.state_dict())


def test_model_config_that_does_not_describe_the_checkpoint_is_named(tmp_path):
    cfg = two_tower_config()
    save_file(torchrec_two_tower_state(cfg), str(tmp_path / "tt.safetensors"))
    with pytest.raises(ExportError, match=r"no tensor named \[<prefix>\.\]sparse_arch.*dlrm"):
        load_torchrec(tmp_path / "tt.safetensors", dlrm_config())
    (tmp_path / "model.toml").write_text('[model]\nkind = "dlrm"\ntables = []\ndense_in_features = 3\n')
    with pytest.raises(ExportError, match=r"--model-config: model.toml: model.tables"):
        read_model_config(tmp_path / "model.toml")
    with pytest.raises(ExportError, match="pickled torch.save files are never read"):
        load_torchrec(tmp_path / "model.toml", cfg)
    torch.save({"x": torch.zeros(1)}, tmp_path / "model.pt")  # TorchRec's retrieval example saves one
    with pytest.raises(ExportError, match="pickled torch.save files are never read"):
        load_torchrec(tmp_path / "model.pt", cfg)


@pytest.fixture(scope="module")
def torchrec_models(tmp_path_factory) -> Path:
    """A TorchRec DLRM and a DLRM_DCN trained and saved with DCP on 2 gloo ranks in the TorchRec reference
    venv (one launch for both: ``<dir>/dlrm``, ``<dir>/dlrm_dcn``)."""
    out = tmp_path_factory.mktemp("torchrec_models")
    run_torchrec_job(out, "dlrm", "dlrm_dcn")
    return out


def _requests(out: Path) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    with safe_open(str(out / "requests.safetensors"), framework="pt") as f:
        keys = json.loads(f.metadata()["keys"])
        r = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is no dict
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=r["values"], lengths=r["lengths"])
    return r["dense"], kjt, r["logits"]


@pytest.mark.slow
def test_torchrec_dlrm_trained_on_two_ranks_is_served_with_torchrecs_scores(
    torchrec_models, tmp_path, capsys
):
    from tests.serving.conftest import running_server

    torchrec_dlrm = torchrec_models / "dlrm"
    source = [
        "--from-torchrec",
        str(torchrec_dlrm / "checkpoint"),
        "--model-config",
        str(torchrec_dlrm / "model.json"),
    ]
    # The export CLI in this process (its argv, its output): a new interpreter would only add torch's import.
    for dtype in ("fp32", "int8"):
        code = recserve_main(["export", *source, "--out", str(tmp_path / dtype), "--dtype", dtype])
        output = capsys.readouterr()
        assert code == 0, output.err
        assert "from TorchRec torch.distributed.checkpoint" in output.out
    dense, kjt, torchrec_logits = _requests(torchrec_dlrm)
    expected = torch.sigmoid(torchrec_logits)

    with running_server(tmp_path / "fp32") as server:
        scores = PredictorClient(f"127.0.0.1:{server.port}").predict(dense, kjt, timeout=30)
    assert torch.equal(scores, expected)

    manifest = read_manifest(tmp_path / "int8")
    assert manifest.accuracy["passed"] and manifest.source["format"] == "torch.distributed.checkpoint"
    with running_server(tmp_path / "int8") as server:
        scores = PredictorClient(f"127.0.0.1:{server.port}").predict(dense, kjt, timeout=30)
    # The accuracy gate measured the int8 package's logit error on its sample; these requests stay within it.
    bound = manifest.accuracy["package"]["max_abs_logit_diff"] * 2 + 1e-3
    assert (torch.logit(scores.double()) - torchrec_logits.double()).abs().max() <= bound


@pytest.mark.slow
def test_torchrec_dlrm_dcn_checkpoint_exports_to_torchrecs_scores(torchrec_models, tmp_path):
    out = torchrec_models / "dlrm_dcn"
    cfg = read_model_config(out / "model.json")
    imported_cfg, state, _ = load_torchrec(out / "checkpoint", cfg)
    path = export_package(tmp_path / "pkg", model_config=imported_cfg, state_dict=state, dtype="fp32")
    dense, kjt, torchrec_logits = _requests(out)
    assert torch.equal(Predictor.load(path).predict_logits(dense, kjt), torchrec_logits)
