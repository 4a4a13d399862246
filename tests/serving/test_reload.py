"""Hot reload under load: a new version swapped in with zero failed requests; a broken one leaves the old."""

import json
import logging
import shutil
import threading
import time
from collections import Counter

import grpc
import pytest

from recserve.client import AdminClient, PredictorClient
from recserve.errors import PackageError

from .conftest import admin_target, random_batch, running_server, scrape, target


def _hammer(client, stop: threading.Event, versions: Counter, errors: list) -> None:
    dense, kjt = random_batch(4, seed=5)
    while not stop.is_set():
        try:
            versions[client.predict_response(dense, kjt, timeout=10).model_version] += 1
        except grpc.RpcError as e:  # any failure fails the test
            errors.append(f"{e.code()}: {e.details()}")


@pytest.mark.slow
def test_watch_dir_swaps_versions_under_load_without_a_failed_request(packages, tmp_path):
    watch = tmp_path / "models"
    shutil.copytree(packages["1"], watch / "1")
    with running_server(None, watch=watch, watch_interval_s=0.1, max_queue_delay_ms=1) as server:
        client = PredictorClient(target(server))
        stop, versions, errors = threading.Event(), Counter(), []
        threads = [threading.Thread(target=_hammer, args=(client, stop, versions, errors)) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        shutil.copytree(packages["2"], watch / "2")  # manifest.json lands with the rest; watch picks it up
        deadline = time.monotonic() + 20
        while versions["2"] < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
        metrics = scrape(server)
    assert errors == []
    assert versions["1"] > 0 and versions["2"] >= 20
    assert metrics["recserve_model_reloads_total"][(("result", "success"),)] == 1
    assert metrics["recserve_model_info"][(("model", "tiny"), ("version", "2"))] == 1
    assert metrics["recserve_model_info"][(("model", "tiny"), ("version", "1"))] == 0


def test_admin_reload_of_a_broken_package_keeps_the_old_model(packages, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(packages["1"], models / "1")
    shutil.copytree(packages["2"], models / "2")
    broken = shutil.copytree(packages["2"], models / "broken")
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["model_config"]["tables"][0]["embedding_dim"] = "x"
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with running_server(models / "1") as server:  # reload root: the package's parent, models/
        client, admin = PredictorClient(target(server)), AdminClient(admin_target(server))
        with pytest.raises(grpc.RpcError) as info:
            admin.reload("broken")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "still serving tiny 1" in info.value.details()
        assert client.predict_response(*random_batch(2)).model_version == "1"
        assert admin.reload(models / "2") == ("tiny", "2", True)
        assert client.predict_response(*random_batch(2)).model_version == "2"
        assert admin.reload("2") == ("tiny", "2", False)
        metrics = scrape(server)
    assert metrics["recserve_model_reloads_total"][(("result", "failure"),)] == 1
    assert metrics["recserve_model_reloads_total"][(("result", "success"),)] == 1
    admin_calls = {
        k: v for k, v in metrics["recserve_requests_total"].items() if "Admin" in dict(k)["method"]
    }
    assert admin_calls == {
        (("code", "FAILED_PRECONDITION"), ("method", "recserve.v1.Admin/ReloadModel")): 1,
        (("code", "OK"), ("method", "recserve.v1.Admin/ReloadModel")): 2,
    }


def test_watch_refuses_a_version_folder_whose_manifest_says_another_version(packages, tmp_path, caplog):
    watch = tmp_path / "models"
    shutil.copytree(packages["1"], watch / "1")
    with running_server(None, watch=watch, watch_interval_s=0.05) as server:
        client = PredictorClient(target(server))
        with caplog.at_level(logging.ERROR, logger="recserve"):
            staged = shutil.copytree(packages["1"], tmp_path / "staged")  # a re-export that kept --version 1
            staged.rename(watch / "3")  # placed atomically, as the docs say
            deadline = time.monotonic() + 20
            while "the folder says version" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        assert client.predict_response(*random_batch(2)).model_version == "1"
        metrics = scrape(server)
    assert "the folder says version 3 but its manifest.json says version '1'" in caplog.text
    assert metrics["recserve_model_reloads_total"][(("result", "failure"),)] == 1


def test_watch_refuses_to_start_on_a_mismatched_newest_version(packages, tmp_path):
    watch = tmp_path / "models"
    shutil.copytree(packages["2"], watch / "5")
    with (
        pytest.raises(PackageError, match=r"folder says version 5 but .* says version '2'"),
        running_server(None, watch=watch),
    ):
        pass


@pytest.mark.parametrize("folder, recorded", [("01", "1"), ("4", "04")])
def test_a_version_folder_must_say_its_version_exactly(packages, tmp_path, folder, recorded):
    watch = tmp_path / "models"
    package = shutil.copytree(packages["1"], watch / folder)
    manifest = json.loads((package / "manifest.json").read_text())
    (package / "manifest.json").write_text(json.dumps({**manifest, "version": recorded}))
    with (
        pytest.raises(PackageError, match=rf"folder says version {folder} but .* says version '{recorded}'"),
        running_server(None, watch=watch),
    ):
        pass


def test_a_linked_version_folder_must_stay_in_the_watch_dir_and_say_its_version(packages, tmp_path, caplog):
    watch = tmp_path / "models"
    shutil.copytree(packages["2"], watch / "2")
    outside = shutil.copytree(packages["1"], tmp_path / "elsewhere" / "9")
    with running_server(None, watch=watch, watch_interval_s=0.05) as server:
        client = PredictorClient(target(server))
        with caplog.at_level(logging.ERROR, logger="recserve"):
            (watch / "9").symlink_to(outside, target_is_directory=True)  # manifest: version 1, outside
            assert _wait_for_text(caplog, "outside the watch dir")
            (watch / "9").unlink()
            (watch / "8").symlink_to(watch / "2", target_is_directory=True)  # inside, but says version 2
            assert _wait_for_text(caplog, "the folder says version 8 but its manifest.json says version '2'")
        assert client.predict_response(*random_batch(2)).model_version == "2"  # never downgraded
        assert scrape(server)["recserve_model_reloads_total"][(("result", "failure"),)] == 2


def _wait_for_text(caplog, text: str, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while text not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    return text in caplog.text
