"""API-key checks and route labels, without a running service."""

from service.app import api
from service.errors import route_family
from service.middleware import body_key, key_is_valid, presented_key, query_key, route_path, route_template


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


def test_the_key_is_read_from_deepls_authorization_scheme():
    assert presented_key({b"authorization": b"DeepL-Auth-Key abc:fx"}) == "abc:fx"
    assert presented_key({b"authorization": b"deepl-auth-key abc"}) == "abc"


def test_libretranslates_api_key_is_read_from_the_body_or_the_query():
    assert body_key("application/json", b'{"q": "Hi", "api_key": "k1"}') == "k1"
    assert body_key("application/x-www-form-urlencoded; charset=utf-8", b"q=Hi&api_key=k2") == "k2"
    assert body_key("application/json", b'{"api_key": 5}') is None
    assert body_key("application/json", b"[1]") is None
    assert body_key("application/json", b"{not json") is None
    assert body_key("text/plain", b"api_key=k1") is None
    assert query_key(b"api_key=k3&q=x") == "k3"
    assert query_key(b"q=x") is None


def test_compatibility_routes_are_told_apart_by_path():
    assert route_family("/translate") == "libretranslate"
    assert route_family("/languages") == "libretranslate"
    assert route_family("/v2/translate") == "deepl"
    assert route_family("/v1/translate") == "v1"
    assert route_family("/healthz") == "v1"


def scope(path: str, method: str = "GET", root_path: str = "") -> dict:
    return {"type": "http", "path": root_path + path, "root_path": root_path, "method": method, "headers": []}


def test_route_labels_are_templates_not_paths():
    assert route_template(api.routes, scope("/v1/explanations/abc123")) == "/v1/explanations/{explanation_id}"
    assert route_template(api.routes, scope("/v1/translate", "POST")) == "/v1/translate"
    assert route_template(api.routes, scope("/static/app.js")) == "/static/"
    assert route_template(api.routes, scope("/wp-admin/install.php")) == "unmatched"
    assert route_template(api.routes, scope("/translate", "POST")) == "/translate"
    assert route_template(api.routes, scope("/v2/languages")) == "/v2/languages"


def test_the_route_path_is_below_the_application_prefix():
    assert route_path(scope("/healthz", root_path="/guarded")) == "/healthz"
    assert route_path(scope("/healthz")) == "/healthz"
    assert route_path(scope("", root_path="/guarded")) == "/"
