"""Every route of REST v1 against the real Ray Serve instance (tiny random models)."""

import math
from pathlib import Path

import pytest

from tests.service.conftest import Tolerance

pytestmark = pytest.mark.slow

EN_ZH = {"source_lang": "en", "target_lang": "zh"}
# The step-by-step numbers recomputed here in float64 from the float32 vectors the service returns.
ARITHMETIC_TOLERANCE = 1e-4


def translate(client, texts, **options):
    response = client.post("/v1/translate", json={"texts": texts, **EN_ZH, **options})
    assert response.status_code == 200, response.text
    return response.json()


def max_difference(a, b) -> float:
    if isinstance(a, list):
        assert len(a) == len(b)
        return max((max_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return abs(a - b)


def test_healthz_says_ok(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_lists_the_loaded_models(client):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "models": ["en-zh", "zh-en"]}


def test_models_describes_each_model(client):
    models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
    assert set(models) == {"en-zh", "zh-en"}
    assert models["en-zh"]["source_lang"] == "en" and models["en-zh"]["target_lang"] == "zh"
    assert len(models["en-zh"]["weights_digest"]) == 16
    assert models["en-zh"]["decoder_layers"] == 2 and models["en-zh"]["decoder_attention_heads"] == 4
    # the alignment head a model directory declares; or, where its model card names a recipe without guided
    # alignment, the penultimate layer's head average (null)
    assert (models["en-zh"]["alignment_layer"], models["en-zh"]["alignment_head"]) == (1, 2)
    assert models["en-zh"]["alignment_source"] == "declared"
    assert (models["zh-en"]["alignment_layer"], models["zh-en"]["alignment_head"]) == (0, None)
    assert models["zh-en"]["alignment_source"] == "fallback"
    assert models["en-zh"]["runtime"]["cpu_isa"] in {"avx512", "avx2", "x86-64"}  # the level the step runs at
    # the int8 tiles an int8 step may choose: the CPU's own flags say which (Linux's /proc/cpuinfo)
    runtime = models["en-zh"]["runtime"]
    if runtime["runtime"] == "compiled" and runtime["precision"] == "int8" and Path("/proc/cpuinfo").is_file():
        flags = set(Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split())
        level = runtime["cpu_isa"]
        expected = "vnni" if level == "avx512" and "avx512_vnni" in flags else "avx2" if level != "x86-64" else ""
        assert runtime["int8_tiles"] == expected


def test_translate_returns_tokens_scores_alignment_and_an_explanation_id(client):
    result = translate(client, ["The cat sat on the mat."], max_length=8)
    assert result["model"] == "en-zh"
    (translation,) = result["translations"]
    assert translation["source_tokens"][-1] == "</s>"
    assert len(translation["token_scores"]) == len(translation["target_tokens"]) <= 8
    assert math.isclose(translation["score"], sum(translation["token_scores"]), abs_tol=1e-4)
    assert len(translation["alignment"]) == len(translation["target_tokens"])
    assert all(0 <= s < len(translation["source_tokens"]) for s, _ in translation["alignment"])
    assert translation["explanation_id"] and "attention" not in translation


def test_translate_picks_the_model_by_id(client):
    response = client.post("/v1/translate", json={"texts": ["我喜欢茶。"], "model": "zh-en", "max_length": 6})
    assert response.status_code == 200
    assert response.json()["model"] == "zh-en"


def test_each_text_of_a_request_is_translated_as_if_alone(client):
    texts = ["I like tea.", "The big dog runs.", "We went to school today."]
    together = translate(client, texts, beam_size=2, max_length=10)["translations"]
    alone = [translate(client, [text], beam_size=2, max_length=10)["translations"][0] for text in texts]
    assert [t["target_tokens"] for t in together] == [t["target_tokens"] for t in alone]


def test_n_best_returns_ranked_alternatives_with_their_own_ids(client):
    (translation,) = translate(client, ["The red book."], beam_size=4, n_best=3, max_length=6)["translations"]
    alternatives = translation["alternatives"]
    assert len(alternatives) == 2
    ids = {translation["explanation_id"], *(a["explanation_id"] for a in alternatives)}
    assert len(ids) == 3


def test_max_length_bounds_the_translation(client):
    (translation,) = translate(client, ["The quick brown fox jumps over the lazy dog."], max_length=3)["translations"]
    assert len(translation["target_tokens"]) <= 3


def test_summary_attention_is_the_declared_alignment_head(client):
    (translation,) = translate(client, ["I see the cat."], attention="full", max_length=5)["translations"]
    attention = translation["attention"]
    assert (attention["layer"], attention["head"]) == (1, 2)
    head = attention["cross_attention"][1][2]
    assert max_difference(attention["summary"], head) < 1e-6
    # the token alignment is that map's row-wise argmax over the source words, never the final </s>
    last = len(translation["source_tokens"]) - 1
    for (s, _), row in zip(translation["alignment"], head, strict=True):
        assert s != last and row[s] == max(row[:last])


def test_summary_attention_without_an_alignment_head_is_the_head_average(client):
    response = client.post(
        "/v1/translate", json={"texts": ["我喜欢茶。"], "model": "zh-en", "attention": "full", "max_length": 5}
    )
    attention = response.json()["translations"][0]["attention"]
    assert (attention["layer"], attention["head"]) == (0, None)
    layer = attention["cross_attention"][0]
    heads = len(layer)
    for t, row in enumerate(attention["summary"]):
        assert math.isclose(sum(row), 1.0, abs_tol=1e-4)
        for s, value in enumerate(row):
            assert math.isclose(value, sum(head[t][s] for head in layer) / heads, abs_tol=1e-6)


def test_full_attention_has_one_map_per_layer_and_head(client):
    (translation,) = translate(client, ["I see the cat."], attention="full", max_length=5)["translations"]
    cross_attention = translation["attention"]["cross_attention"]
    assert len(cross_attention) == 2 and len(cross_attention[0]) == 4
    assert len(cross_attention[0][0]) == len(translation["target_tokens"])
    assert len(cross_attention[0][0][0]) == len(translation["source_tokens"])


def test_summary_attention_omits_the_full_maps(client):
    (translation,) = translate(client, ["I see the cat."], attention="summary", max_length=5)["translations"]
    assert translation["attention"]["cross_attention"] is None


def test_a_fetched_explanation_equals_the_inline_full_attention(client):
    (translation,) = translate(client, ["The cat sat on the mat."], attention="full", max_length=8)["translations"]
    response = client.get(f"/v1/explanations/{translation['explanation_id']}")
    assert response.status_code == 200
    explanation = response.json()
    assert explanation["model"] == "en-zh"
    assert explanation["source_tokens"] == translation["source_tokens"]
    assert explanation["target_tokens"] == translation["target_tokens"]
    assert explanation["translation"] == translation["text"]
    assert explanation["source"] == "The cat sat on the mat."
    inline = translation["attention"]["cross_attention"]
    assert max_difference(explanation["cross_attention"], inline) < Tolerance.ATTENTION
    assert explanation["alignment"] == translation["alignment"]
    for key in ("word_alignment", "source_words", "target_words"):  # a permalink shows the same word alignment
        assert explanation[key] == translation[key]
    assert (explanation["alignment_layer"], explanation["alignment_head"]) == (1, 2)
    # every score but a length-capped final </s> (forced, log-probability 0 in search) is the model's own
    assert max_difference(explanation["token_scores"][:-1], translation["token_scores"][:-1]) < Tolerance.SCORE


def test_an_explanation_is_the_same_from_every_replica(client):
    (translation,) = translate(client, ["We drink water."], max_length=6)["translations"]
    fetched = [client.get(f"/v1/explanations/{translation['explanation_id']}").json() for _ in range(6)]
    for explanation in fetched[1:]:
        assert max_difference(explanation["cross_attention"], fetched[0]["cross_attention"]) < Tolerance.ATTENTION


def test_explanations_work_for_a_model_with_separate_vocabularies(client):
    response = client.post(
        "/v1/translate", json={"texts": ["我喜欢茶。"], "model": "zh-en", "attention": "full", "max_length": 6}
    )
    (translation,) = response.json()["translations"]
    explanation = client.get(f"/v1/explanations/{translation['explanation_id']}").json()
    assert explanation["model"] == "zh-en"
    inline = translation["attention"]["cross_attention"]
    assert max_difference(explanation["cross_attention"], inline) < Tolerance.ATTENTION


def softmax(values):
    peak = max(values)
    exps = [math.exp(v - peak) for v in values]
    return [e / sum(exps) for e in exps]


def check_step_arithmetic(steps):
    q, k, v = steps["q"], steps["k"], steps["v"]
    assert len(q) == steps["d_k"] and all(len(row) == steps["d_k"] for row in k + v)
    scores = [sum(a * b for a, b in zip(q, key, strict=True)) for key in k]
    assert max_difference(steps["scores"], scores) < ARITHMETIC_TOLERANCE
    assert max_difference(steps["scaled_scores"], [s / math.sqrt(steps["d_k"]) for s in scores]) < ARITHMETIC_TOLERANCE
    assert max_difference(steps["weights"], softmax(steps["scaled_scores"])) < ARITHMETIC_TOLERANCE
    output = [sum(w * value[i] for w, value in zip(steps["weights"], v, strict=True)) for i in range(steps["d_k"])]
    assert max_difference(steps["output"], output) < ARITHMETIC_TOLERANCE


def test_explain_steps_add_up_and_match_the_cross_attention_map(client):
    body = {"source": "The cat sat on the mat.", **EN_ZH, "kind": "cross", "layer": 1, "head": 2, "position": 1}
    response = client.post("/v1/explain", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    steps = result["steps"]
    assert (steps["kind"], steps["layer"], steps["head"], steps["position"]) == ("cross", 1, 2, 1)
    check_step_arithmetic(steps)
    assert max_difference(steps["weights"], result["cross_attention"][1][2][1]) < Tolerance.ATTENTION
    assert len(steps["x"]) == len(result["source_tokens"]) and len(steps["x_query"]) == len(steps["x"][0])


def test_explain_opens_encoder_self_attention_too(client):
    body = {"source": "I like green tea.", **EN_ZH, "kind": "encoder_self", "layer": 0, "head": 3, "position": 2}
    result = client.post("/v1/explain", json=body).json()
    check_step_arithmetic(result["steps"])
    assert max_difference(result["steps"]["weights"], result["encoder_self_attention"][0][3][2]) < Tolerance.ATTENTION


def test_explain_without_a_target_explains_the_models_own_translation(client):
    # with the alignment /v1/explain gives by default, so that the explanation ids name the same thing
    (translation,) = translate(client, ["I like tea."], beam_size=4, alignment_method="agreement")["translations"]
    result = client.post("/v1/explain", json={"source": "I like tea.", **EN_ZH, "beam_size": 4}).json()
    assert result["target_tokens"] == translation["target_tokens"]
    assert result["explanation_id"] == translation["explanation_id"]


def test_explain_force_decodes_a_given_target(client):
    result = client.post("/v1/explain", json={"source": "I like tea.", "target": "我喜欢茶。", **EN_ZH}).json()
    assert result["target_tokens"][-1] == "</s>"
    assert result["translation"] == "我喜欢茶。"
    assert len(result["cross_attention"][0][0]) == len(result["target_tokens"])
    # the fetch runs the encoder through fused attention, /v1/explain through the softmax that also returns the
    # encoder's weights, perhaps on another replica: equal to float32 rounding (tests/service/conftest.py)
    fetched = client.get(f"/v1/explanations/{result['explanation_id']}").json()
    assert max_difference(fetched["cross_attention"], result["cross_attention"]) < Tolerance.ATTENTION


def test_explain_by_explanation_id_uses_exactly_the_decoded_tokens(client):
    (translation,) = translate(client, ["The cat sat on the mat."], beam_size=2, attention="full")["translations"]
    body = {"explanation_id": translation["explanation_id"], "kind": "cross", "layer": 1, "head": 3, "position": 0}
    response = client.post("/v1/explain", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["target_tokens"] == translation["target_tokens"]
    assert result["explanation_id"] == translation["explanation_id"] and result["model"] == "en-zh"
    check_step_arithmetic(result["steps"])
    # The steps' weights are the very row the translation itself returned for that head.
    inline = translation["attention"]["cross_attention"]
    assert max_difference(result["steps"]["weights"], inline[1][3][0]) < Tolerance.ATTENTION


def test_the_viewer_is_served_at_the_root(client):
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")


def test_static_assets_are_served(client):
    assert client.get("/static/index.html").status_code == 200


def test_openapi_documents_every_route(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/translate",
        "/v1/explanations/{explanation_id}",
        "/v1/explain",
        "/v1/models",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in paths
    assert client.get("/docs").status_code == 200


def test_metrics_are_prometheus_text(client):
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert "translation_http_requests_total" in response.text


def test_blank_texts_translate_to_nothing_without_running_the_model(client):
    texts = ["", "   \t\n ", "I like tea."]
    together = translate(client, texts, max_length=6)["translations"]
    alone = translate(client, ["I like tea."], max_length=6)["translations"][0]
    for blank in together[:2]:
        assert blank["text"] == "" and blank["target_tokens"] == [] and blank["explanation_id"] is None
        assert blank["alignment"] == [] and blank["score"] == 0.0
    assert together[2]["target_tokens"] == alone["target_tokens"]  # the others are untouched


def test_min_length_holds_the_end_token_back(client):
    """min_length is transformers' min_new_tokens: no </s> before that many tokens (</s> counted)."""
    (free,) = translate(client, ["Hi."], beam_size=1, max_length=30)["translations"]
    (held,) = translate(client, ["Hi."], beam_size=1, min_length=20, max_length=30)["translations"]
    assert len(held["target_tokens"]) >= 20 and held["target_tokens"][-1] == "</s>"
    assert len(held["target_tokens"]) > len(free["target_tokens"]) or len(free["target_tokens"]) >= 20
    refused = client.post("/v1/translate", json={"texts": ["Hi."], **EN_ZH, "min_length": 9, "max_length": 8})
    assert refused.status_code == 422
    # without max_length, a min_length beyond the default budget (2 × source + 10) raises the budget to it
    (longer,) = translate(client, ["Hi."], beam_size=1, min_length=40)["translations"]
    assert len(longer["source_tokens"]) * 2 + 10 < 40
    assert len(longer["target_tokens"]) == 40 and longer["target_tokens"][-1] == "</s>"
