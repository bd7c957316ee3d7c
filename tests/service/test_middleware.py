"""API-key checks and route labels, without a running service."""

from service.app import api
from service.middleware import key_is_valid, presented_key, route_path, route_template


def test_a_key_matches_only_an_accepted_key():
    assert key_is_valid("k2", ["k1", "k2"])
    assert not key_is_valid("k3", ["k1", "k2"])
    assert not key_is_valid("k", ["k1"])
    assert not key_is_valid("", [""])
    assert not key_is_valid(None, ["k1"])


def test_the_key_is_read_from_bearer_or_x_api_key():
    assert presented_key({b"authorization": b"Bearer abc"}) == "abc"
    assert presented_key({b"authorization": b"bearer abc "}) == "abc"
    assert presented_key({b"x-api-key": b"xyz"}) == "xyz"
    assert presented_key({b"authorization": b"Basic abc"}) is None
    assert presented_key({}) is None


def scope(path: str, method: str = "GET", root_path: str = "") -> dict:
    return {"type": "http", "path": root_path + path, "root_path": root_path, "method": method, "headers": []}


def test_route_labels_are_templates_not_paths():
    assert route_template(api.routes, scope("/v1/explanations/abc123")) == "/v1/explanations/{explanation_id}"
    assert route_template(api.routes, scope("/v1/translate", "POST")) == "/v1/translate"
    assert route_template(api.routes, scope("/static/app.js")) == "/static/"
    assert route_template(api.routes, scope("/wp-admin/install.php")) == "unmatched"


def test_the_route_path_is_below_the_application_prefix():
    assert route_path(scope("/healthz", root_path="/guarded")) == "/healthz"
    assert route_path(scope("/healthz")) == "/healthz"
    assert route_path(scope("", root_path="/guarded")) == "/"
