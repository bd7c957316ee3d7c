"""service/text/languages.py: clients' language codes, and detection among the served languages only."""

import pytest

from service.text.languages import detect, resolve

SERVED = frozenset({"en", "zh"})


@pytest.mark.parametrize(
    "code, served", [("zh", "zh"), ("ZH-HANS", "zh"), ("zh_CN", "zh"), ("EN-US", "en"), ("en-GB", "en"), ("EN", "en")]
)
def test_client_spellings_resolve_to_the_served_code(code, served):
    assert resolve(code, SERVED) == served


@pytest.mark.parametrize("code", ["zh-Hant", "ZH-TW", "zt", "de", "", None])
def test_other_languages_and_traditional_chinese_do_not_resolve(code):
    assert resolve(code, SERVED) is None


def test_detection_chooses_among_the_served_languages():
    assert detect("I like tea very much.", SERVED)[0].language == "en"
    assert detect("我喜欢喝茶。", SERVED)[0].language == "zh"
    assert detect("Ich trinke gern Tee.", SERVED)[0].language == "en"  # German is not served: never answered


def test_a_text_without_letters_is_detected_with_zero_confidence():
    assert detect("1234", SERVED)[0].confidence == 0


def test_confidence_is_a_percentage():
    assert 0 < detect("I like tea.", SERVED)[0].confidence <= 100
