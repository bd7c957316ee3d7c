"""deploy/k8s/rayservice.yaml and rayservice-gpu.yaml are valid KubeRay RayServices whose pods Kubernetes would accept.

Kubernetes' own OpenAPI schemas (the kubernetes-validate package, offline) check every pod template
the RayService carries; the RayService fields KubeRay reads are checked here by hand, because its
CRD schema ships with the operator, not with any package. test_deploy.py checks the serve config
inside each against deploy/serve.yaml or serve-gpu.yaml and lints the Dockerfile.
"""

from pathlib import Path

import pytest
import ray
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = {
    name: yaml.safe_load((REPO / "deploy" / "k8s" / name).read_text())
    for name in ("rayservice.yaml", "rayservice-gpu.yaml")
}
each_manifest = pytest.mark.parametrize("manifest", list(MANIFESTS))


def cluster_of(manifest: str) -> dict:
    return MANIFESTS[manifest]["spec"]["rayClusterConfig"]


def groups_of(manifest: str) -> dict[str, dict]:
    cluster = cluster_of(manifest)
    return {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster.get("workerGroupSpecs", [])}}


# (manifest, group) for every pod group of every manifest
MANIFEST_GROUPS = [(manifest, group) for manifest in MANIFESTS for group in groups_of(manifest)]
each_group = pytest.mark.parametrize(
    ("manifest", "group"), MANIFEST_GROUPS, ids=[f"{manifest}-{group}" for manifest, group in MANIFEST_GROUPS]
)


def validate_pod_template(name: str, template: dict) -> None:
    """Kubernetes' schema for a PodTemplate holding `template`, strict: unknown fields fail."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    resource = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}
    kubernetes_validate.validate(resource, kubernetes_validate.latest_version(), strict=True)


@each_group
def test_each_pod_template_passes_the_kubernetes_schema(manifest, group):
    validate_pod_template(f"attention-translate-{group}", groups_of(manifest)[group]["template"])


def test_the_schema_check_catches_a_misspelt_field():
    container = {"name": "ray-head", "image": "attention-translate:latest", "resource": {}}
    with pytest.raises(Exception, match="'resource' was unexpected"):
        validate_pod_template("broken", {"spec": {"containers": [container]}})


@each_group
def test_ray_start_params_are_strings_as_kuberay_requires(manifest, group):
    params = groups_of(manifest)[group]["rayStartParams"]
    assert all(isinstance(key, str) and isinstance(value, str) for key, value in params.items()), params


@each_manifest
def test_worker_group_replica_bounds_are_ordered(manifest):
    for group in cluster_of(manifest).get("workerGroupSpecs", []):
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]


@each_manifest
def test_the_ray_version_is_the_one_the_service_is_tested_with(manifest):
    assert cluster_of(manifest)["rayVersion"] == ray.__version__


@each_manifest
def test_every_pod_exposes_the_serve_port_and_runs_as_non_root(manifest):
    for name, group in groups_of(manifest).items():
        spec = group["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        ports = {port["containerPort"] for container in spec["containers"] for port in container.get("ports", [])}
        assert 8000 in ports, name


@each_manifest
def test_the_serve_config_is_an_embedded_yaml_string(manifest):
    ray_service = MANIFESTS[manifest]
    assert isinstance(ray_service["spec"]["serveConfigV2"], str)
    assert yaml.safe_load(ray_service["spec"]["serveConfigV2"])["applications"]


# ---- the RayService itself, against KubeRay's CRD (deploy/k8s/kuberay-crd, vendored from kuberay v1.7.0) ----
CRD = REPO / "deploy" / "k8s" / "kuberay-crd" / "ray.io_rayservices.yaml"


def closed(schema: dict) -> dict:
    """The CRD schema with unknown fields refused: every object that lists its properties gets
    additionalProperties false (the API server would prune such fields silently), unless it says
    x-kubernetes-preserve-unknown-fields; int-or-string fields accept both."""
    schema = dict(schema)
    if schema.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema:
        schema["properties"] = {name: closed(value) for name, value in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = closed(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            schema[key] = [closed(part) for part in schema[key]]
    return schema


@pytest.fixture(scope="module")
def rayservice_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "RayService"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return closed(version["schema"]["openAPIV3Schema"])


@each_manifest
def test_the_manifest_is_a_valid_rayservice_of_kuberay_1_7(rayservice_schema, manifest):
    jsonschema = pytest.importorskip("jsonschema")
    ray_service = MANIFESTS[manifest]
    assert ray_service["apiVersion"] == "ray.io/v1" and ray_service["kind"] == "RayService"
    errors = sorted(jsonschema.Draft7Validator(rayservice_schema).iter_errors(ray_service), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


@each_manifest
def test_the_schema_check_refuses_unknown_and_misspelt_fields(rayservice_schema, manifest):
    """The check can fail: a misspelt field and a wrong type are caught, where the API server would prune or refuse."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(rayservice_schema)
    ray_service = MANIFESTS[manifest]
    misspelt = {**ray_service, "spec": {**ray_service["spec"], "upgradeStrategyy": {"type": "NewCluster"}}}
    assert any("upgradeStrategyy" in e.message for e in validator.iter_errors(misspelt))
    wrong_type = {**ray_service, "spec": {**ray_service["spec"], "serviceUnhealthySecondThreshold": "soon"}}
    assert list(validator.iter_errors(wrong_type))


@each_manifest
def test_the_upgrade_strategy_is_chosen(rayservice_schema, manifest):
    assert MANIFESTS[manifest]["spec"]["upgradeStrategy"]["type"] == "NewCluster"
