"""deploy/k8s cannot drift from the product: every manifest parses and every command it runs is accepted by
the real ``rectrain`` / ``recserve`` / ``torchrun`` parsers, with ports, paths and volumes that line up."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import tomllib

from tests.deploy.manifests import (
    DEPLOY,
    container_argv,
    container_port,
    json_files,
    k8s_object,
    k8s_objects,
    load_json,
    load_yaml,
    pod_spec,
    read_command,
    volume_for,
    workloads,
    yaml_files,
)

NAMESPACE = "rectrain"
HEALTH_SERVICE = "recserve.v1.Predictor"


def test_every_yaml_and_json_file_parses():
    files = yaml_files() + json_files()
    assert len(files) >= 12, [str(p.relative_to(DEPLOY)) for p in files]
    for path in yaml_files():
        assert load_yaml(path), f"{path} holds no YAML document"
    for path in json_files():
        assert isinstance(load_json(path), dict), f"{path} is not a JSON object"


def test_k8s_objects_are_well_formed_and_in_one_namespace():
    kinds = set()
    for path, doc in k8s_objects():
        where = f"{path.name}: {doc.get('kind')}"
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), where
        assert doc["metadata"].get("name"), where
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, where
        kinds.add(doc["kind"])
    expected = {"Namespace", "PersistentVolumeClaim", "ConfigMap", "Service", "Job", "Deployment"}
    assert expected | {"HorizontalPodAutoscaler"} <= kinds


def test_every_container_command_is_accepted_by_the_real_cli():
    seen = set()
    for name, workload in workloads():
        pod = pod_spec(workload)
        for container in pod["containers"]:
            where = f"{name} container {container['name']}"
            command = read_command(container_argv(container, where), where)
            seen.add(command.program)
            resources = container.get("resources", {})
            assert resources.get("requests") and resources.get("limits"), f"{where}: requests and limits"
            image = container["image"].rsplit("/", 1)[-1].split(":")[0]
            assert image == command.program, f"{where}: runs {command.program} in image {container['image']}"
            assert pod["securityContext"]["runAsNonRoot"] is True, where
    assert seen == {"rectrain", "recserve"}


def _trainer():
    job = k8s_object("Job", "rectrain-train")
    (container,) = pod_spec(job)["containers"]
    return job, container, read_command(container_argv(container, "train Job"), "train Job")


def test_training_is_an_indexed_job_of_torchrun_agents_meeting_at_pod_0():
    job, container, command = _trainer()
    spec, pod = job["spec"], pod_spec(job)
    launcher = command.launcher
    assert launcher is not None, "the training Job should launch through torchrun"
    assert spec["completionMode"] == "Indexed"
    assert int(launcher.nnodes) == spec["completions"] == spec["parallelism"]
    assert launcher.rdzv_backend == "c10d" and launcher.module
    assert importlib.util.find_spec("rectrain.__main__") is not None, (
        "`-m rectrain` needs rectrain/__main__.py"
    )
    # The endpoint is pod 0 of the Job under the headless Service named by the pod's subdomain.
    service = k8s_object("Service", pod["subdomain"])
    host, port = launcher.rdzv_endpoint.rsplit(":", 1)
    assert host.startswith(f"{job['metadata']['name']}-0.{pod['subdomain']}.<POD_NAMESPACE>.svc"), host
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert (
        [p["port"] for p in service["spec"]["ports"]]
        == [int(port)]
        == [container_port(container, "rendezvous")]
    )
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert pod["restartPolicy"] == "OnFailure" and launcher.max_restarts > 0
    # Restarts need a fresh rendezvous store per round (see comm.env.warn_shared_store).
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") == "1"


def _run_config_text(container, pod, config_path: str) -> str:
    volume, key = volume_for(pod, container, config_path)
    config_map = k8s_object("ConfigMap", volume["configMap"]["name"])
    assert key in config_map["data"], f"ConfigMap {config_map['metadata']['name']} has no {key}"
    return config_map["data"][key]


def test_run_config_in_the_config_map_loads_and_checkpoints_onto_the_shared_volume(tmp_path: Path):
    job, container, command = _trainer()
    assert command.args.command == "train", command.args
    text = _run_config_text(container, pod_spec(job), command.args.config)
    try:
        from rectrain.train.config import RunConfig
    except ImportError as e:
        pytest.fail(f"the k8s run config needs rectrain.train.config.RunConfig to be checked: {e}")
    path = tmp_path / "run.toml"
    path.write_text(text)
    config = RunConfig.load(path)
    assert config.checkpoint.resume is True, "a restarted pod must resume from the latest checkpoint"
    assert config.checkpoint.every_n_steps > 0
    volume, _ = volume_for(pod_spec(job), container, config.checkpoint.dir)
    assert volume["persistentVolumeClaim"]["claimName"] == "rectrain-checkpoints"
    if config.train.metrics_log:
        volume_for(pod_spec(job), container, config.train.metrics_log)
    assert config.train.steps or config.train.epochs
    assert tomllib.loads(text)["checkpoint"]["dir"] == config.checkpoint.dir


def _exporter():
    job = k8s_object("Job", "recserve-export")
    (container,) = pod_spec(job)["containers"]
    return job, container, read_command(container_argv(container, "export Job"), "export Job")


def _server():
    deployment = k8s_object("Deployment", "recserve")
    (container,) = pod_spec(deployment)["containers"]
    return deployment, container, read_command(container_argv(container, "server"), "server Deployment")


def test_export_reads_the_training_checkpoints_and_writes_a_versioned_package():
    train_job, trainer, train = _trainer()
    config = tomllib.loads(_run_config_text(trainer, pod_spec(train_job), train.args.config))
    job, container, command = _exporter()
    assert command.args.command == "export"
    assert str(command.args.checkpoint) == config["checkpoint"]["dir"]
    volume, _ = volume_for(pod_spec(job), container, str(command.args.checkpoint))
    assert volume["persistentVolumeClaim"]["claimName"] == "rectrain-checkpoints"
    raw_out = container["args"][container["args"].index("--out") + 1]
    assert raw_out.endswith("/$(MODEL_VERSION)"), "packages go to one numbered directory per version"
    assert Path(str(command.args.out)).name == command.args.version, "the package's version is its directory"
    volume, _ = volume_for(pod_spec(job), container, str(command.args.out))
    assert volume["persistentVolumeClaim"]["claimName"] == "recserve-packages"


def test_server_serves_exported_versions_and_watches_for_new_ones():
    _, _, export = _exporter()
    deployment, container, command = _server()
    args = command.args
    assert args.command == "serve"
    # No pinned --package: the server serves the highest version under --watch and swaps in newer ones.
    assert args.package is None
    assert Path(str(args.watch)) == Path(str(export.args.out)).parent
    volume, _ = volume_for(pod_spec(deployment), container, str(args.watch))
    assert volume["persistentVolumeClaim"]["claimName"] == "recserve-packages"
    assert args.host == args.metrics_host == "0.0.0.0", "in a pod the server must listen beyond loopback"
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"] == 0


def test_server_ports_probes_and_services_match_its_flags():
    deployment, container, command = _server()
    grpc_port, metrics_port = command.args.port, command.args.metrics_port
    assert container_port(container, "grpc") == grpc_port
    assert container_port(container, "metrics") == metrics_port
    assert container_port(container, "http") == command.args.http_port  # Open Inference Protocol REST
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc_port, probe
    assert container["readinessProbe"]["grpc"]["service"] == HEALTH_SERVICE
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics_port)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {p["name"] for p in container["ports"]}
    for name in ("recserve", "recserve-headless"):
        service = k8s_object("Service", name)
        assert service["spec"]["selector"].items() <= labels.items(), name
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, (name, port)
    grpc = [p for p in k8s_object("Service", "recserve")["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc[0]["port"] == grpc_port


def test_hpa_scales_the_server_deployment_on_cpu_within_its_requests():
    hpa = k8s_object("HorizontalPodAutoscaler", "recserve")
    deployment, container, _ = _server()
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and "cpu" in container["resources"]["requests"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"


def test_termination_grace_outlasts_the_pre_stop_pause_and_the_drain():
    deployment, container, command = _server()
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
    assert grace > pause + command.args.drain_timeout, (grace, pause, command.args.drain_timeout)
    assert command.args.workers * command.args.torch_threads <= int(container["resources"]["limits"]["cpu"])


def test_admin_service_stays_inside_the_pod():
    deployment, container, command = _server()
    args = command.args
    assert args.admin_host == "127.0.0.1", "beyond loopback the admin port needs --admin-token or mTLS"
    assert args.admin_port not in (args.port, args.metrics_port)
    assert args.admin_port not in {p["containerPort"] for p in container["ports"]}, "admin is not exposed"
    for name in ("recserve", "recserve-headless"):
        ports = {p["port"] for p in k8s_object("Service", name)["spec"]["ports"]}
        assert args.admin_port not in ports, name
