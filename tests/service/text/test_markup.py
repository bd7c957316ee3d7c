"""service/text/markup.py: HTML text nodes translated, every tag and attribute kept."""

import re

from service.text.markup import TagRules, parse_markup

TAG = re.compile(r"<[^>]+>")


def test_text_nodes_are_the_units_and_tags_stay_in_place():
    fragment = '<p class="a">I like <b>cats</b>.<br/>Tom &amp; Jerry</p>'
    markup = parse_markup(fragment)
    assert markup.units == ["I like ", "cats", ".", "Tom & Jerry"]
    rendered = markup.render(["我喜欢", "猫", "。", "汤姆 & 杰瑞 <3"])
    assert TAG.findall(rendered) == TAG.findall(fragment)
    assert rendered == '<p class="a">我喜欢<b>猫</b>。<br/>汤姆 &amp; 杰瑞 &lt;3</p>'


def test_code_scripts_and_notranslate_are_left_alone():
    fragment = '<p>Run <code>ls -l</code> <span translate="no">Acme</span><script>if (a < b) x();</script></p>'
    markup = parse_markup(fragment)
    assert markup.units == ["Run "]
    assert markup.render(["运行 "]) == fragment.replace("Run ", "运行 ")


def test_whitespace_between_tags_is_not_translated():
    markup = parse_markup("<ul>\n  <li>One</li>\n</ul>")
    assert markup.units == ["One"]
    assert markup.render(["一"]) == "<ul>\n  <li>一</li>\n</ul>"


def test_tag_rules_leave_ignored_elements_as_written_and_read_others_inline_or_as_breaks():
    fragment = "<doc>Open <x>the file</x> with <term>green tea</term> <b>now</b>.</doc>"
    markup = parse_markup(fragment, TagRules(ignore=frozenset({"x"}), non_splitting=frozenset({"term"}),
                                             splitting=frozenset({"b"})))  # fmt: skip
    assert "the file" not in markup.units
    texts = [block.text for block in markup.blocks]
    assert " with green tea " in texts  # <term> inside the sentence: one block with its words
    assert "now" in texts  # <b> made a break: its words are a block of their own
    assert markup.render([f"[{unit}]" for unit in markup.units]).count("<x>the file</x>") == 1
