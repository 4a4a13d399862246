"""``recserve export`` names the model after the checkpoint's run unless ``--model-name`` says otherwise."""

from recserve.export.cli import default_model_name


def test_default_model_name_is_the_checkpoint_run(tmp_path):
    assert default_model_name(tmp_path / "ckpt" / "dlrm", {}) == "dlrm"
    assert default_model_name(tmp_path / "ckpt" / "dlrm" / "step_100", {}) == "dlrm"
    assert default_model_name(tmp_path / "ckpt" / "dlrm", {"run_name": "ctr-v2"}) == "ctr-v2"
    assert default_model_name(tmp_path / "ckpt" / "dlrm", {"run_name": ""}) == "dlrm"
    assert default_model_name(tmp_path / "ckpt" / "dlrm", {"run_name": 3}) == "dlrm"
