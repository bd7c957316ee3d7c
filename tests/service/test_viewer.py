"""The explanation viewer (GET /) in a real browser: Debian's chromium driven by Playwright.

Every test types a sentence into the page, translates it through the running service and
checks what the page shows against the REST API's own numbers, read with httpx. Screenshots
go to artifacts/viewer/ (ignored by git).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

# The page and the test fetch the same explanation in two requests, perhaps from two replicas: equal to float32
# rounding (Tolerance, tests/service/conftest.py).
from tests.service.conftest import SHIFT_MODEL, Tolerance

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the browser: Debian's chromium)")

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "viewer"
SENTENCES = {"en": "The cat sat on the mat.", "zh": "猫坐在垫子上。"}
LONG_SENTENCE = {
    "en": "The quick brown fox jumps over the lazy dog, and then the cat sat on the big red mat in the house "
    "because it was very cold outside this morning and everyone was drinking hot tea.",
    "zh": "今天早上外面很冷，所以我的朋友们都在家里喝热茶、读书，小猫坐在红色的垫子上看着窗外的大树和小河。",
}
TIMEOUT_MS = 120_000  # a first translation on a loaded 2-core machine can take a while
# What a script leaves on screen when it renders a missing value; ASCII-letter boundaries, so Chinese counts too.
PLACEHOLDER_WORDS = re.compile(r"(?<![A-Za-z])(undefined|NaN|null)(?![A-Za-z])")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no {CHROMIUM}: apt-get install chromium fonts-wqy-microhei"),
]


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def api(service_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def model(api: httpx.Client) -> dict:
    """The model the tests translate with: en→zh when there is one."""
    models = api.get("/v1/models").json()["models"]
    return next((m for m in models if (m["source_lang"], m["target_lang"]) == ("en", "zh")), models[0])


def open_page(browser: sync_api.Browser, service_url: str, color_scheme: str = "light", locale: str = "en-US"):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=color_scheme, locale=locale)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    # HTTP errors are the page's to explain (tests read its status line); scripts must never fail.
    page.on(
        "console",
        lambda message: (
            message.type == "error"
            and not message.text.startswith("Failed to load resource")
            and errors.append(f"console: {message.text}")
        ),
    )
    page.goto(service_url + "/")
    page.wait_for_selector("#model-select option[value]:not([value=''])", state="attached")
    return context, page, errors


@pytest.fixture
def page(browser: sync_api.Browser, service_url: str):
    context, page, errors = open_page(browser, service_url)
    yield page
    context.close()
    assert errors == [], errors


def translate(page, model: dict, text: str | None = None, beam_size: int = 2, n_best: int = 2) -> str:
    """Type a sentence, press Translate, wait for the heatmap; returns the explanation id the page shows."""
    page.select_option("#model-select", model["id"])
    page.fill("#source-text", text or SENTENCES.get(model["source_lang"], SENTENCES["en"]))
    page.fill("#beam-size", str(beam_size))
    page.fill("#n-best", str(n_best))
    page.click("#translate-button")
    page.wait_for_selector("#heatmap td.cell")
    page.wait_for_selector("#translate-button:not([disabled])")
    return location_explanation_id(page)


def numbers(page, selector: str, *fields: str) -> list:
    """The data-* attributes `fields` of every node `selector` matches, as numbers (one value, or a tuple)."""
    rows = page.eval_on_selector_all(
        selector, "(nodes, fields) => nodes.map(n => fields.map(f => Number(n.dataset[f])))", list(fields)
    )
    return [row[0] if len(fields) == 1 else tuple(row) for row in rows]


def shown_cells(page) -> dict[tuple[int, int], float]:
    return {(t, s): value for t, s, value in numbers(page, "#heatmap td.cell", "t", "s", "value")}


def head_average(heads: list[list[list[float]]]) -> list[list[float]]:
    return [[sum(h[t][s] for h in heads) / len(heads) for s in range(len(heads[0][0]))] for t in range(len(heads[0]))]


def show_steps(page) -> str | None:
    """Press "Show the steps" and wait for them; returns the error the page shows instead, if any."""
    page.click("#steps-button")
    page.wait_for_selector("#step-weights .weight-row, #steps-status[data-kind=error]")
    page.wait_for_selector("#steps-button:not([disabled])")
    error = page.locator("#steps-status[data-kind=error]")
    return error.inner_text() if error.count() else None


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def look_at(page, name: str) -> None:
    """Screenshot the screen, then check that none of its visible text is a missing value ("undefined", ...)."""
    screenshot(page, name)
    text = page.evaluate("document.body.innerText")
    lines = [line for line in text.splitlines() if PLACEHOLDER_WORDS.search(line)]
    assert lines == [], f"{name}: {lines}"


def hold_first(page, pattern: str, when=lambda request: True) -> list:
    """Hold back the first request matching `pattern` and `when` (others go through); it lands in the returned list."""
    held: list = []

    def handle(route) -> None:
        if held or not when(route.request):
            route.continue_()
        else:
            held.append(route)

    page.route(pattern, handle)
    return held


def wait_until_held(page, held: list) -> None:
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not held:
        assert time.monotonic() < deadline, "the request to hold back was never sent"
        page.wait_for_timeout(50)  # lets Playwright dispatch the route


def release(page, route) -> None:
    """Let a held request go on and wait until its answer reached the page (unless the page aborted it)."""
    with contextlib.suppress(sync_api.Error):  # an aborted request can no longer be continued
        route.continue_()
    with contextlib.suppress(sync_api.Error):
        response = route.request.response()  # None when the request failed (aborted)
        if response is not None:
            response.finished()
    page.wait_for_timeout(300)  # the page's own handlers run after the body arrived


def location_explanation_id(page) -> str:
    return page.evaluate("decodeURIComponent(location.hash.replace('#explanation=', ''))")


def shifted(rows: list) -> list:
    """Row t becomes row t + 1, the step where target token t is the decoder's input; the last row repeats."""
    return rows[1:] + rows[-1:] if len(rows) > 1 else rows


def alignment_map(explanation: dict) -> list:
    """The map the service reads alignments from: the declared alignment head, else the layer's head average,
    at the rows the model reads them (shifted with alignment_shift)."""
    layer = explanation["cross_attention"][explanation["alignment_layer"]]
    head = explanation["alignment_head"]
    rows = head_average(layer) if head is None else layer[head]
    return shifted(rows) if explanation["alignment_shift"] else rows


# ---------------------------------------------------------------- tests


def test_heatmap_has_one_cell_per_target_and_source_token_with_the_explanations_values(page, api, model):
    explanation_id = translate(page, model)
    explanation = api.get(f"/v1/explanations/{explanation_id}").json()
    attention = explanation["cross_attention"]
    target_count, source_count = len(explanation["target_tokens"]), len(explanation["source_tokens"])

    # Opens on the alignment head (or, without one, the alignment layer's head average): the map the
    # alignment is computed from, and says so in a line.
    cells = shown_cells(page)
    assert set(cells) == {(t, s) for t in range(target_count) for s in range(source_count)}
    expected = alignment_map(explanation)
    note = page.inner_text("#alignment-head-note")
    assert f"layer {explanation['alignment_layer'] + 1}" in note
    # and why that head, as /v1/models says (the tiny en-zh declares it in its config.json)
    assert model["alignment_source"] == "declared" and "config.json" in note
    if explanation["alignment_head"] is not None:
        assert f"head {explanation['alignment_head'] + 1}" in note
        assert page.input_value("#head-select") == str(explanation["alignment_head"])
    else:
        assert "average" in note and page.input_value("#head-select") == "avg"
    # The tiny models declare no alignment_shift: rows are the steps that predict each token, as the note implies.
    assert model["alignment_shift"] is False and explanation["alignment_shift"] is False
    assert page.input_value("#rows-select") == "predicts"
    assert "decoder's input" not in note
    for (t, s), value in cells.items():
        assert value == pytest.approx(expected[t][s], abs=Tolerance.ATTENTION), (t, s)

    # One chosen layer and head shows exactly that head's weights.
    layer, head = 0, len(attention[0]) - 1
    page.select_option("#layer-select", str(layer))
    page.select_option("#head-select", str(head))
    cells = shown_cells(page)
    assert len(cells) == target_count * source_count
    for (t, s), value in cells.items():
        assert value == pytest.approx(attention[layer][head][t][s], abs=Tolerance.ATTENTION), (t, s)

    assert page.locator("#heatmap tbody th button.tok-target").count() == target_count
    assert page.locator("#heatmap th.src-head").count() == source_count
    # Confidence: one probability per target token, exp(log-probability).
    probabilities = numbers(page, "#confidence [data-prob]", "prob")
    expected_probabilities = [2.718281828459045**score for score in explanation["token_scores"]]
    assert probabilities == pytest.approx(expected_probabilities, rel=Tolerance.SCORE)
    # The sentencepiece marks shown on tokens ("·" joins a piece to the word before, "␣" a lone space) are explained.
    legend = page.locator("#token-legend")
    assert legend.is_visible() and "·" in legend.inner_text() and "␣" in legend.inner_text()
    look_at(page, "heatmap-light-en")

    # The word view merges pieces into the service's words; every row still sums to 1.
    page.check("input[name=view][value=words]")
    page.select_option("#head-select", "avg")
    request = {"texts": [page.input_value("#source-text")], "model": model["id"], "beam_size": 2, "n_best": 2}
    words = api.post("/v1/translate", json=request).json()["translations"][0]
    cells = shown_cells(page)
    assert len(cells) == len(words["target_words"]) * len(words["source_words"])
    for t in range(len(words["target_words"])):
        assert sum(cells[t, s] for s in range(len(words["source_words"]))) == pytest.approx(1, abs=1e-4)


def test_a_shift_model_opens_on_the_rows_its_alignment_is_read_from(browser, continuous_service_url):
    """alignment_shift: row t of the alignment head is read at the step where token t is the decoder's input."""
    with httpx.Client(base_url=continuous_service_url, timeout=120) as api:
        model = next(m for m in api.get("/v1/models").json()["models"] if m["id"] == SHIFT_MODEL)
        assert model["alignment_shift"] is True and model["alignment_head"] is not None
        context, page, errors = open_page(browser, continuous_service_url)
        try:
            explanation_id = translate(page, model)
            explanation = api.get(f"/v1/explanations/{explanation_id}").json()
            assert explanation["alignment_shift"] is True
            layer, head = explanation["alignment_layer"], explanation["alignment_head"]
            raw = explanation["cross_attention"][layer][head]
            target_count, source_count = len(raw), len(raw[0])
            assert target_count >= 2, "a shift needs two rows to show"

            # Opens on the alignment head, reading the rows the alignment is read from, and says so.
            assert page.input_value("#head-select") == str(head)
            assert page.input_value("#rows-select") == "reads"
            assert "decoder's input" in page.inner_text("#alignment-head-note")
            cells = shown_cells(page)
            for (t, s), value in cells.items():
                assert value == pytest.approx(raw[min(t + 1, target_count - 1)][s], abs=Tolerance.ATTENTION), (t, s)
            # The brightest cell of each row (never the source </s>) is the token the head's one-best aligns it with.
            head_only = {"explanation_id": explanation_id, "alignment_method": "head"}
            aligned = {t: s for s, t in api.post("/v1/explain", json=head_only).json()["alignment"]}
            for t in range(target_count):
                row = [cells[t, s] for s in range(source_count - 1)]
                assert row.index(max(row)) == aligned[t], t
            # The lines stay the server's alignment: the viewer asks for the better one, both models' agreement (the
            # service holds the tiny zh-en too), and says so.
            assert explanation["alignment_method"] == "agreement"
            assert "agree" in page.inner_text("#alignment-head-note")
            lines = set(numbers(page, "#align-lines line.aligned", "s", "t"))
            assert lines == {tuple(pair) for pair in explanation["alignment"]}

            # The tooltip and the selection summary read the displayed rows too.
            t, s = 0, aligned[0]
            page.hover(f"#heatmap td.cell[data-t='{t}'][data-s='{s}']")
            assert f"{raw[1][s]:.4f}" in page.inner_text("#tooltip")
            page.click(f"#align-target button[data-t='{t}']")
            assert f"({raw[1][s]:.2f})" in page.inner_text("#selection-summary")
            look_at(page, "shift-reads-light-en")

            # "predicts": the raw rows of cross_attention, lines unchanged.
            page.select_option("#rows-select", "predicts")
            cells = shown_cells(page)
            assert len(cells) == target_count * source_count
            for (t, s), value in cells.items():
                assert value == pytest.approx(raw[t][s], abs=Tolerance.ATTENTION), (t, s)
            assert set(numbers(page, "#align-lines line.aligned", "s", "t")) == lines
            # Another head keeps the chosen rows.
            page.select_option("#head-select", "avg")
            average = head_average(explanation["cross_attention"][layer])
            assert shown_cells(page)[0, 0] == pytest.approx(average[0][0], abs=Tolerance.ATTENTION)

            # The note says it in Chinese too.
            page.click("#ui-lang")
            assert "解码器输入" in page.inner_text("#alignment-head-note")
            assert page.inner_text("#rows-select option[value=reads]") == "读入该词元的一步"
        finally:
            context.close()
    assert errors == [], errors


def test_choosing_an_alternative_shows_its_own_explanation(page, api, model):
    translate(page, model, beam_size=3, n_best=3)
    choices = page.locator("#alternatives button.alt-choice")
    assert choices.count() >= 2
    assert choices.nth(0).get_attribute("aria-pressed") == "true"
    second = choices.nth(1)
    second.click()
    page.wait_for_selector("#alternatives button.alt-choice[data-rank='1'][aria-pressed=true]")
    explanation_id = location_explanation_id(page)
    explanation = api.get(f"/v1/explanations/{explanation_id}").json()
    assert page.inner_text("#translation-text") == explanation["translation"] == second.inner_text()
    expected = alignment_map(explanation)
    cells = shown_cells(page)
    assert len(cells) == len(expected) * len(expected[0])
    for (t, s), value in cells.items():
        assert value == pytest.approx(expected[t][s], abs=Tolerance.ATTENTION), (t, s)
    look_at(page, "alternatives-light-en")


def test_a_late_explanation_of_an_earlier_choice_never_replaces_a_later_one(page, api, model):
    translate(page, model, beam_size=3, n_best=3)
    choices = page.locator("#alternatives button.alt-choice")
    assert choices.count() >= 2
    held = hold_first(page, "**/v1/explanations/**")
    choices.nth(1).click()  # its explanation is held back ...
    wait_until_held(page, held)
    later = 2 if choices.count() > 2 else 0  # ... while another choice (or the one on screen) comes after it
    choices.nth(later).click()
    page.wait_for_selector(f"#alternatives button.alt-choice[data-rank='{later}'][aria-pressed=true]")
    release(page, held[0])

    assert page.get_attribute("#alternatives button.alt-choice[data-rank='1']", "aria-pressed") == "false"
    assert page.get_attribute(f"#alternatives button.alt-choice[data-rank='{later}']", "aria-pressed") == "true"
    explanation = api.get(f"/v1/explanations/{location_explanation_id(page)}").json()
    assert page.inner_text("#translation-text") == explanation["translation"] == choices.nth(later).inner_text()
    assert page.inner_text("#status") == ""  # not left saying it is still fetching


def test_steps_asked_for_before_a_new_explanation_never_appear_with_it(page, api, model):
    translate(page, model, beam_size=3, n_best=3)
    # The steps' request, not the attributions the page asks for by itself (the source share).
    held = hold_first(page, "**/v1/explain", lambda request: "method" not in (request.post_data_json or {}))
    page.click("#steps-button")
    wait_until_held(page, held)
    page.locator("#alternatives button.alt-choice").nth(1).click()  # a new explanation while the steps compute
    page.wait_for_selector("#alternatives button.alt-choice[data-rank='1'][aria-pressed=true]")
    release(page, held[0])

    assert page.locator("#steps").is_hidden()
    assert page.locator("#steps .step").count() == 0
    assert page.is_enabled("#steps-button")
    assert page.inner_text("#steps-status") == ""


def test_clicking_a_target_token_highlights_the_source_tokens_it_is_aligned_with(page, api, model):
    explanation = api.get(f"/v1/explanations/{translate(page, model)}").json()
    for t in range(len(explanation["target_tokens"])):
        page.click(f"#align-target button[data-t='{t}']")
        expected = {s for s, target in explanation["alignment"] if target == t}
        assert set(numbers(page, "#heatmap td.cell.aligned", "t", "s")) == {(t, s) for s in expected}
        assert set(numbers(page, "#align-source [data-aligned=true]", "s")) == expected
        assert page.get_attribute(f"#align-target button[data-t='{t}']", "aria-pressed") == "true"

    # The keyboard does the same: arrow keys walk the heatmap, Enter selects the row's target token.
    page.focus("#heatmap td.cell[data-t='0'][data-s='0']")
    page.keyboard.press("ArrowDown" if len(explanation["target_tokens"]) > 1 else "ArrowRight")
    page.keyboard.press("Enter")
    row = page.evaluate("Number(document.activeElement.dataset.t)")
    assert page.get_attribute(f"#heatmap button.tok-target[data-t='{row}']", "aria-pressed") == "true"
    look_at(page, "alignment-light-en")


@pytest.mark.parametrize("kind", ["cross", "encoder_self"])
def test_step_by_step_shows_the_weights_of_the_api(page, api, model, kind):
    explanation = api.get(f"/v1/explanations/{translate(page, model)}").json()
    target = min(1, len(explanation["target_tokens"]) - 1)
    page.click(f"#align-target button[data-t='{target}']")
    page.select_option("#steps-kind", kind)
    heads = model["decoder_attention_heads"] if kind == "cross" else model["encoder_attention_heads"]
    position = target if kind == "cross" else len(explanation["source_tokens"]) - 1
    layer, head = 0, heads - 1
    page.select_option("#steps-layer", str(layer))
    page.select_option("#steps-head", str(head))
    page.select_option("#steps-position", str(position))
    assert show_steps(page) is None

    view = {"kind": kind, "layer": layer, "head": head, "position": position}
    steps = api.post("/v1/explain", json={"explanation_id": explanation["explanation_id"], **view}).json()["steps"]
    shown = numbers(page, "#step-weights .weight-row", "value")
    assert shown == pytest.approx(steps["weights"], abs=Tolerance.ATTENTION)
    if kind == "cross":  # the very row of the map the translation's explanation holds
        assert shown == pytest.approx(explanation["cross_attention"][layer][head][position], abs=Tolerance.ATTENTION)
    assert numbers(page, "#step-scores .score-row", "value") == pytest.approx(steps["scores"], abs=Tolerance.SCORE)
    # Each of the five steps is on the page with its formula.
    assert page.locator("#steps .step .formula").count() == 5
    look_at(page, f"steps-{kind}-light-en")


def attributions(api: httpx.Client, explanation_id: str, method: str) -> dict:
    response = api.post("/v1/explain", json={"explanation_id": explanation_id, "method": method})
    assert response.status_code == 200, response.text
    return response.json()["attributions"]


def explain_methods(page) -> list[str]:
    """The methods of every POST /v1/explain the page sends from now on (it fills the returned list)."""
    methods: list[str] = []

    def record(request) -> None:
        if request.url.endswith("/v1/explain") and request.method == "POST":
            methods.append((request.post_data_json or {}).get("method", "attention"))

    page.on("request", record)
    return methods


def choose_method(page, method: str) -> None:
    """Switch the heatmap's method and wait until it is drawn (attributions carry a Σ column, attention none)."""
    page.select_option("#method-select", method)
    if method == "attention":
        page.wait_for_selector("#heatmap td.cell")
        assert page.locator("#heatmap td.row-share").count() == 0
    else:
        page.wait_for_selector("#heatmap td.row-share, #method-status[data-kind=error]")


def test_the_method_switch_draws_the_apis_attributions_and_switching_back_restores_attention(page, api, model):
    methods = explain_methods(page)
    explanation_id = translate(page, model)
    attention_cells = shown_cells(page)
    attention_legend = page.inner_text("#legend-note")
    target_count = len(api.get(f"/v1/explanations/{explanation_id}").json()["target_tokens"])
    # A real <select> with a label.
    assert page.get_by_label("Method", exact=True).evaluate("node => node.id") == "method-select"
    assert page.input_value("#method-select") == "attention"

    for method in ["alti_plus", "input_x_gradient"]:
        choose_method(page, method)
        expected = attributions(api, explanation_id, method)
        cells = shown_cells(page)
        assert set(cells) == {(t, s) for t in range(len(expected["source"])) for s in range(len(expected["source"][0]))}
        assert len(expected["source"]) == target_count
        for (t, s), value in cells.items():
            assert value == pytest.approx(expected["source"][t][s], abs=Tolerance.ATTRIBUTION), (method, t, s)
        # The Σ column: each row's source share; the rest of the row's 1 came from the target prefix.
        shown_shares = numbers(page, "#heatmap td.row-share", "value")
        assert shown_shares == pytest.approx(expected["source_share"], abs=Tolerance.ATTRIBUTION)
        # The legend says what the numbers are now.
        assert page.locator("#method-note").is_visible()
        assert "target prefix" in page.inner_text("#legend-note")
        assert "target prefix" in page.inner_text("#heatmap-help")
        assert page.inner_text("#method-status") == ""
        # The selected token's target-prefix part, in the summary: its share (the target row's sum).
        last = target_count - 1
        page.click(f"#heatmap button.tok-target[data-t='{last}']")
        prefix = page.inner_text("#prefix-summary")
        shown = re.search(r"(<?)(\d+(?:\.\d)?)% of it came from the target prefix", prefix)
        assert shown, prefix
        share = sum(expected["target"][last])
        assert float(shown[2]) == pytest.approx(100 * share, abs=0.1 if share < 0.1 else 0.5), prefix
        look_at(page, f"method-{method}-light-en")

    choose_method(page, "attention")
    assert shown_cells(page) == attention_cells
    assert page.locator("#prefix-summary").count() == 0
    assert page.inner_text("#legend-note") == attention_legend
    assert page.locator("#method-note").is_hidden()
    # ALTI+ was asked once (the source share's answer drew its heatmap too); attention needs no request.
    assert methods == ["alti_plus", "input_x_gradient"]

    # The heatmap keeps its method for the next translation, and the interface's language follows.
    choose_method(page, "alti_plus")
    page.click("#ui-lang")
    assert "目标前缀" in page.inner_text("#legend-note")
    assert page.inner_text("#method-select option[value=alti_plus]").startswith("ALTI+")
    look_at(page, "method-alti_plus-light-zh")


def test_the_source_share_bar_shows_each_tokens_share_and_marks_none(page, api, model):
    """ALTI+'s source share per token, as numbers only: bench.trust found no separation of wrong translations by it,
    so no token is marked as suspect (the trust block marks words)."""
    text = SENTENCES.get(model["source_lang"], SENTENCES["en"])
    explanation_id = translate(page, model, text)
    page.wait_for_selector("#source-share [data-share]")
    expected = attributions(api, explanation_id, "alti_plus")["source_share"]
    # The same numbers as /v1/translate's own source_share for that translation.
    body = {
        "texts": [text],
        "model": model["id"],
        "beam_size": 2,
        "n_best": 2,
        "source_share": True,
        "split_sentences": False,
        "alignment_method": "agreement",  # as the viewer asks
    }
    translated = api.post("/v1/translate", json=body).json()["translations"][0]
    assert translated["explanation_id"] == explanation_id
    assert translated["token_source_shares"] == pytest.approx(expected, abs=Tolerance.ATTRIBUTION)

    shares = numbers(page, "#source-share [data-share]", "share")
    assert len(shares) == len(translated["target_tokens"])  # one mark per target token
    assert shares == pytest.approx(expected, abs=Tolerance.ATTRIBUTION)
    assert page.locator("#source-share .low-share, #source-share [data-low]").count() == 0
    for t in {0, len(shares) - 1}:  # each mark's tooltip gives its number
        page.hover(f"#source-share button[data-t='{t}']")
        assert re.search(r"\d+(\.\d)?%", page.inner_text("#tooltip"))
    # The tokens are the target language's, labelled so for the font choice.
    assert set(page.eval_on_selector_all("#source-share button", "ns => ns.map(n => n.lang)")) == {model["target_lang"]}
    assert page.inner_text("#share-status") == ""
    look_at(page, "source-share-light-en")

    # Clicking a mark selects its token in every panel.
    page.click("#source-share button[data-t='0']")
    assert page.get_attribute("#heatmap button.tok-target[data-t='0']", "aria-pressed") == "true"

    # The interface in Chinese; words: one mark per word, the mean of its pieces' shares.
    page.click("#ui-lang")
    assert page.inner_text("#share-heading") == "每个词元的源份额 (ALTI+)"
    assert "来自原文" in page.get_attribute("#source-share button[data-t='0']", "data-tip")
    page.check("input[name=view][value=words]")
    assert page.locator("#source-share [data-share]").count() == page.locator("#heatmap tbody tr").count()
    look_at(page, "source-share-words-light-zh")


def test_the_trust_block_shows_the_answers_score_and_marks_its_flagged_words(page, api, model):
    """The viewer shows /v1/translate's trust for the translation it shows: the score, each finding, and the
    flagged words marked on their sentence (checked against a client's answer for the same request)."""
    text = SENTENCES.get(model["source_lang"], SENTENCES["en"])
    with page.expect_response("**/v1/translate") as answer:
        translate(page, model, text)
    shown = answer.value.json()["translations"][0]
    trust = shown["trust"]
    assert page.locator("#trust-block").is_visible()
    assert float(page.get_attribute("#trust-score", "data-score")) == trust["score"]
    # the score's meaning in words comes with a calibration only (its held-out bin)
    assert page.locator("#trust-meaning").is_visible() == (trust["held_out"] is not None)
    assert page.locator("#trust-flags li[data-kind]").count() == len(trust["flags"])
    for flag in trust["flags"]:
        container = "#trust-source" if flag["side"] == "source" else "#trust-target"
        for word in flag["words"]:
            kinds = page.get_attribute(f"{container} mark[data-w='{word}']", "data-flags").split()
            assert flag["kind"] in kinds
    marked = page.locator("#trust-source mark, #trust-target mark").count()
    assert marked == len({(f["side"], w) for f in trust["flags"] for w in f["words"]})

    # A constructed answer with one flag of each side: the page marks exactly those words.
    def flagged(route) -> None:
        response = route.fetch()
        payload = response.json()
        hypothesis = payload["translations"][0]
        hypothesis["trust"]["flags"] = [
            {"kind": "omission", "side": "source", "words": [0], "text": [hypothesis["source_words"][0]]},
            {"kind": "repetition", "side": "target", "words": [0], "text": [hypothesis["target_words"][0]]},
        ]
        hypothesis["trust"]["held_out"] = {"low": 0.61, "high": 0.7, "answers": 92, "adequate": 0.7065}
        route.fulfill(response=response, json=payload)

    page.route("**/v1/translate", flagged)
    translate(page, model, text)
    assert page.get_attribute("#trust-source mark[data-w='0']", "data-flags") == "omission"
    assert page.get_attribute("#trust-target mark[data-w='0']", "data-flags") == "repetition"
    assert page.locator("#trust-flags li[data-kind]").count() == 2
    meaning = page.inner_text("#trust-meaning")  # a calibrated answer's held-out bin, said in words
    assert "About 7 in 10" in meaning and "92 translations" in meaning
    look_at(page, "trust-light-en")
    page.click("#ui-lang")
    assert page.inner_text("#trust-heading") == "可信度"


def test_a_pair_too_long_for_attributions_says_so_on_the_page(page, api, model):
    """A pair over the attributions' token limit: the API answers 413, and the page shows its message in the
    source-share bar and for a chosen method, never a blank or stale heatmap; attention still works."""
    sentence = "the quick brown fox sat on the mat" if model["source_lang"] == "en" else "猫坐在垫子上。"
    explanation_id = translate(page, model, " ".join([sentence] * 12))
    response = api.post("/v1/explain", json={"explanation_id": explanation_id, "method": "alti_plus"})
    assert response.status_code == 413, response.text
    message = response.json()["error"]["message"]

    page.wait_for_selector("#share-status[data-kind=error]")
    assert message in page.inner_text("#share-status")
    assert page.locator("#share-status").is_visible()
    assert page.locator("#source-share [data-share]").count() == 0

    choose_method(page, "saliency")
    status = page.locator("#method-status[data-kind=error]")
    assert status.is_visible() and message in status.inner_text()
    assert page.locator("#heatmap td.cell").count() == 0  # no numbers of another method or translation
    look_at(page, "attributions-too-long")

    choose_method(page, "attention")
    assert page.locator("#heatmap td.cell").count() > 0
    assert page.inner_text("#method-status") == ""


# Each interface language once, each colour scheme once: the scheme changes colours only (what look_at shows).
@pytest.mark.parametrize(("locale", "color_scheme"), [("en-US", "light"), ("zh-CN", "dark")])
def test_long_sentence_renders_in_both_color_schemes_and_interface_languages(
    browser, service_url, model, color_scheme, locale
):
    context, page, errors = open_page(browser, service_url, color_scheme, locale)
    try:
        chinese = locale.startswith("zh")
        assert page.get_attribute("html", "lang") == ("zh-CN" if chinese else "en")
        assert page.inner_text("h1") == ("注意力翻译" if chinese else "Attention Translate")
        translate(page, model, LONG_SENTENCE.get(model["source_lang"], LONG_SENTENCE["en"]))
        page.click("#align-target button[data-t='0']")
        # The steps may be refused (413) when the translation, tokenized again, exceeds the model's positions
        # (tiny random models babble); the page must then say why instead of showing stale numbers.
        if show_steps(page) is not None:
            assert page.locator("#step-weights").count() == 0
        # Long sentences scroll inside their panels; the page itself never grows sideways.
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        look_at(page, f"long-{color_scheme}-{locale}")

        # The toggle switches the interface language without translating again.
        page.click("#ui-lang")
        assert page.inner_text("h1") == ("Attention Translate" if chinese else "注意力翻译")
        assert page.locator("#heatmap td.cell").count() > 0
        look_at(page, f"long-{color_scheme}-{locale}-switched")
    finally:
        context.close()
    assert errors == [], errors


def greedy_translation(api: httpx.Client, model: dict, text: str) -> dict:
    """What /v1/translate answers for `text` with beam size 1, as the viewer asks for it (the agreed alignment)."""
    body = {
        "texts": [text], "model": model["id"], "beam_size": 1, "split_sentences": False,
        "alignment_method": "agreement",
    }  # fmt: skip
    response = api.post("/v1/translate", json=body)
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]


def start_translation(page, model: dict, text: str, beam_size: int = 1, n_best: int = 1) -> None:
    page.select_option("#model-select", model["id"])
    page.fill("#source-text", text)
    page.fill("#beam-size", str(beam_size))
    page.fill("#n-best", str(n_best))
    page.click("#translate-button")


def test_a_greedy_translation_goes_through_the_stream_and_shows_what_the_api_answers(page, api, model):
    """Beam size 1 asks /v1/translate/stream, which sends every token as it is decoded under either scheduler
    policy."""
    text = SENTENCES.get(model["source_lang"], SENTENCES["en"])
    expected = greedy_translation(api, model, text)
    posted: list[str] = []
    page.on(
        "request",
        lambda request: posted.append(request.url.split("/v1/", 1)[-1]) if "/v1/translate" in request.url else None,
    )
    explanation_id = translate(page, model, text, beam_size=1, n_best=1)
    assert posted == ["translate/stream"]
    assert page.text_content("#translation-text") == expected["text"]
    assert explanation_id == expected["explanation_id"]
    streamed = page.get_attribute("#translation-text", "data-streamed-tokens")
    assert streamed is not None and int(streamed) == len(expected["target_tokens"])  # each as it was decoded
    assert page.locator("#status[data-kind=ok]").count() == 1


def test_a_continuous_scheduler_streams_the_tokens_onto_the_page_before_the_explanation(
    browser, continuous_service_url
):
    """With `scheduler: continuous` the text and one heatmap row per token are on screen while the explanation
    request is still held back; then the page ends with exactly what /v1/translate answers."""
    text = SENTENCES["en"]
    with httpx.Client(base_url=continuous_service_url, timeout=120) as api:
        model = api.get("/v1/models").json()["models"][0]
        expected = greedy_translation(api, model, text)
    context, page, errors = open_page(browser, continuous_service_url)
    try:
        held = hold_first(page, "**/v1/explanations/**")
        start_translation(page, model, text)
        wait_until_held(page, held)
        streamed = page.get_attribute("#translation-text", "data-streamed-tokens")
        assert streamed is not None and int(streamed) == len(expected["target_tokens"])
        assert page.text_content("#translation-text") == expected["text"]
        assert page.locator("#heatmap tbody tr").count() == int(streamed)
        rows = page.eval_on_selector_all(
            "#heatmap tbody tr",
            "rows => rows.map(r => [...r.querySelectorAll('td.cell')]"
            ".reduce((sum, c) => sum + Number(c.dataset.value), 0))",
        )
        assert rows == pytest.approx([1.0] * len(rows), abs=1e-3)  # each row: attention weights over the source
        release(page, held[0])
        page.wait_for_selector("#translate-button:not([disabled])")
        page.wait_for_selector("#status[data-kind=ok]")
        assert page.text_content("#translation-text") == expected["text"]
        assert location_explanation_id(page) == expected["explanation_id"]
        assert page.locator("#heatmap tbody tr").count() == len(expected["target_tokens"])
        look_at(page, "streamed")
    finally:
        context.close()
    assert errors == [], errors


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_api_docs_render_offline_from_the_services_own_files(browser, service_url, path):
    """/docs (Swagger UI) and /redoc with every request outside the service refused: their scripts, styles and
    fonts come from the service itself, and the page renders the /v1/translate operation."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    refused: list[str] = []

    def only_the_service(route) -> None:
        if route.request.url.startswith(service_url + "/"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    try:
        context.route("**/*", only_the_service)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(service_url + path)
        if path == "/docs":
            operation = page.locator(
                ".opblock-post", has=page.locator(".opblock-summary-path", has_text="/v1/translate")
            )
            operation.first.wait_for(state="visible")
            assert operation.first.locator(".opblock-summary-method").inner_text() == "POST"
        else:  # ReDoc: one section per operation, the path in its request panel
            operation = page.locator("[data-section-id^='operation/']", has_text="/v1/translate")
            operation.first.wait_for(state="attached")
            assert "post" in operation.first.inner_text().lower()
        screenshot(page, f"docs-offline{path.replace('/', '-')}")
    finally:
        context.close()
    assert refused == []


def test_the_pages_word_grouping_is_the_services(page):
    """tokens.js groups pieces into words as model/tokenizer.py does, a lone ▁ included (word view, lines)."""
    from model.tokenizer import word_groups

    cases = [
        ["▁", "我", "喜欢", "猫", "。", "</s>"],
        ["▁The", "▁", "5", "▁cats", "</s>"],
        ["▁我", "喜欢", "▁", "</s>"],
        ["▁", "▁", "ab", "c", "</s>"],
        ["▁", "</s>"],
        ["▁The", "▁qu", "ick", "▁fox", ".", "</s>"],
    ]
    grouped = page.evaluate(
        "async (cases) => { const t = await import('/static/tokens.js'); return cases.map((c) => t.wordGroups(c)); }",
        cases,
    )
    assert grouped == [word_groups(pieces) for pieces in cases]


def test_the_viewer_marks_what_the_translation_kept_as_written(page, api, model):
    text = "Hello %s, open https://example.com/help for 4521 files."
    translate(page, model, text=text, beam_size=2, n_best=1)
    marked = page.eval_on_selector_all("#translation-text mark.kept", "nodes => nodes.map(n => n.textContent)")
    assert sorted(marked) == sorted(["%s", "https://example.com/help", "4521"])  # in the translation's order
    shown = page.inner_text("#translation-text")
    body = {"texts": [text], "model": model["id"], "beam_size": 2, "n_best": 1, "attention": "none",
            "split_sentences": False, "alignment_method": "agreement"}  # fmt: skip
    assert shown == api.post("/v1/translate", json=body).json()["translations"][0]["text"]
    listed = page.eval_on_selector_all("#kept-spans li code", "nodes => nodes.map(n => n.textContent)")
    assert sorted(listed) == sorted(["%s", "https://example.com/help", "4521"])
    assert page.is_visible("#kept-block")
