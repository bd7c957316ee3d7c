"""HTML through LibreTranslate's /translate: inline tags placed by the word alignment, the markup never broken.

Two independent checks: Python's html.parser reads input and output, and every element must come back
with the same start tag (byte for byte) under the same ancestors; and the placement is checked against
what /v1/translate answers for the same plain sentence (its text, tokens and alignment are the oracle).
"""

from __future__ import annotations

import html
import unicodedata
from collections import Counter
from html.parser import HTMLParser

import pytest

pytestmark = pytest.mark.slow

FRAGMENTS = [
    "<p>I like <b>tea</b> very much.</p>",
    "<p>The <a href=\"https://e.example/?a=1&amp;b=2\" title='x'>big dog</a> runs to the <em>house</em>.</p>",
    "<div>We <strong>drink</strong> water. The <i>cat</i> sat on the mat.<br>I see <span class=k>you</span>.</div>",
    "<p>I <b>like <i>green</i> tea</b>.</p>",  # nested: the tags stay between their text nodes
    "<p><b>I like tea. The cat sat.</b> We walk.</p>",  # an element over two sentences
    '<p>Run <code>ls -l</code> and <span translate="no">Acme</span> <u></u>today.</p>',
    "<ul>\n  <li>One <b>red</b> book</li>\n  <li>Two</li>\n</ul>",
]


class _Elements(HTMLParser):
    """Each start tag as written, with the start tags of its ancestors; end tags must close what is open."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, str]] = []
        self.found: Counter = Counter()
        self.mismatched = 0
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        raw = self.get_starttag_text()
        self.found[(raw, tuple(start for _, start in self.open))] += 1
        if tag not in ("br", "img", "hr"):
            self.open.append((tag, raw))

    def handle_endtag(self, tag):
        if not self.open or self.open[-1][0] != tag:
            self.mismatched += 1
        else:
            self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


def elements(fragment: str) -> _Elements:
    parser = _Elements()
    parser.feed(fragment)
    parser.close()
    return parser


def translate_html(client, fragment: str) -> str:
    response = client.post("/translate", json={"q": fragment, "source": "en", "target": "zh", "format": "html"})
    assert response.status_code == 200, response.text
    return response.json()["translatedText"]


@pytest.mark.parametrize("fragment", FRAGMENTS)
def test_every_element_comes_back_with_its_attributes_and_ancestors(client, fragment):
    before, after = elements(fragment), elements(translate_html(client, fragment))
    assert after.found == before.found
    assert after.mismatched == before.mismatched == 0 and not after.open


def nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


@pytest.mark.parametrize(
    "before, wrapped, after",
    [("I like ", "tea", " very much."), ("The ", "big dog", " runs to the house."), ("We drink ", "water", ".")],
)
def test_the_tag_wraps_the_target_tokens_v1_aligns_to_its_words(client, before, wrapped, after):
    sentence = before + wrapped + after
    # the tags go by the better alignment, both models' agreement (the test service serves zh→en too)
    request = {"texts": [sentence], "source_lang": "en", "target_lang": "zh", "alignment_method": "agreement"}
    response = client.post("/v1/translate", json=request)
    oracle = response.json()["translations"][0]
    assert oracle["alignment_method"] == "agreement"
    output = translate_html(client, f"<p>{before}<b>{wrapped}</b>{after}</p>")
    assert output.startswith("<p>") and output.endswith("</p>")
    inner_html = output[len("<p>") : -len("</p>")]
    # the sentence is translated once, as a whole: without the tags it is /v1's translation
    assert html.unescape(inner_html.replace("<b>", "").replace("</b>", "")) == oracle["text"]
    # the source tokens inside <b>, read off /v1's own tokens
    tokens = oracle["source_tokens"]
    assert "".join(tokens[:-1]).replace("\u2581", " ").strip() == sentence  # the tiny vocabulary covers it
    position, inside = 0, set()
    for index, token in enumerate(tokens[:-1]):
        text = token.replace("\u2581", " ")
        start = position + len(text) - len(text.lstrip(" "))
        position += len(text)
        if len(before) <= start and position <= len(before) + len(wrapped):
            inside.add(index)
    targets = sorted(t for s, t in oracle["alignment"] if s in inside and oracle["target_tokens"][t] != "</s>")
    content = html.unescape(inner_html.split("<b>")[1].split("</b>")[0])
    if not targets:
        assert content == ""  # nothing aligned: the element is kept, empty
        return
    core = nfkc("".join(oracle["target_tokens"][targets[0] : targets[-1] + 1]).replace("\u2581", " ").strip())
    assert core in nfkc(content)
    assert nfkc(content).replace(core, "", 1).isalnum() or nfkc(content) == core  # widened only to whole words
