"""deploy/k8s/rayservice.yaml is a valid KubeRay RayService whose pods Kubernetes would accept.

Kubernetes' own OpenAPI schemas (the kubernetes-validate package, offline) check every pod template
the RayService carries; the RayService fields KubeRay reads are checked here by hand, because its
CRD schema ships with the operator, not with any package. test_deploy.py checks the serve config
inside it against deploy/serve.yaml and lints the Dockerfile.
"""

from pathlib import Path

import pytest
import ray
import yaml

REPO = Path(__file__).resolve().parents[2]
RAY_SERVICE = yaml.safe_load((REPO / "deploy" / "k8s" / "rayservice.yaml").read_text())
CLUSTER = RAY_SERVICE["spec"]["rayClusterConfig"]
GROUPS = {"head": CLUSTER["headGroupSpec"], **{g["groupName"]: g for g in CLUSTER.get("workerGroupSpecs", [])}}


def validate_pod_template(name: str, template: dict) -> None:
    """Kubernetes' schema for a PodTemplate holding `template`, strict: unknown fields fail."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    resource = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}
    kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("group", list(GROUPS))
def test_each_pod_template_passes_the_kubernetes_schema(group):
    validate_pod_template(f"attention-translate-{group}", GROUPS[group]["template"])


def test_the_schema_check_catches_a_misspelt_field():
    container = {"name": "ray-head", "image": "attention-translate:latest", "resource": {}}
    with pytest.raises(Exception, match="'resource' was unexpected"):
        validate_pod_template("broken", {"spec": {"containers": [container]}})


@pytest.mark.parametrize("group", list(GROUPS))
def test_ray_start_params_are_strings_as_kuberay_requires(group):
    params = GROUPS[group]["rayStartParams"]
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in params.items()), params


def test_worker_group_replica_bounds_are_ordered():
    for group in CLUSTER.get("workerGroupSpecs", []):
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]


def test_the_ray_version_is_the_one_the_service_is_tested_with():
    assert CLUSTER["rayVersion"] == ray.__version__


def test_every_pod_exposes_the_serve_port_and_runs_as_non_root():
    for name, group in GROUPS.items():
        spec = group["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        ports = {port["containerPort"] for container in spec["containers"] for port in container.get("ports", [])}
        assert 8000 in ports, name


def test_the_serve_config_is_an_embedded_yaml_string():
    assert isinstance(RAY_SERVICE["spec"]["serveConfigV2"], str)
    assert yaml.safe_load(RAY_SERVICE["spec"]["serveConfigV2"])["applications"]
