"""The independent oracle of what a UI string must keep: translate-toolkit's placeables (printf, Python, Qt,
Java MessageFormat and brace formats, URLs, e-mail addresses), and Debian's zh_CN gettext catalogs held out for
evaluation (never trained on), read at run time.
"""

from __future__ import annotations

import gettext
from pathlib import Path

import pytest

CATALOGS = Path("/usr/share/locale/zh_CN/LC_MESSAGES")
EVALUATION_CATALOGS = ("git", "coreutils", "dpkg", "glib20")


def toolkit_spans(text: str, braces: bool = False) -> list[str]:
    """The placeables translate-toolkit finds in `text`, in order; braces adds its generic {…} and {{…}}."""
    placeables = pytest.importorskip("translate.storage.placeables")
    general = placeables.general
    kinds = [
        general.FormattingPlaceable,
        general.PythonFormattingPlaceable,
        general.QtFormattingPlaceable,
        general.UrlPlaceable,
        general.EmailPlaceable,
        general.JavaMessageFormatPlaceable,
    ]
    if braces:
        kinds.append(general.BracePlaceable)
    tree = placeables.parse(text, general.parsers)
    return [str(p) for p in tree.flatten() if isinstance(p, tuple(kinds))]


def evaluation_messages() -> list[tuple[str, str]]:
    """(English msgid, Chinese msgstr) of every message in the evaluation catalogs; skips without them."""
    if not CATALOGS.is_dir():
        pytest.skip("Debian's zh_CN gettext catalogs are not installed")
    messages = []
    for domain in EVALUATION_CATALOGS:
        path = CATALOGS / f"{domain}.mo"
        if path.exists():
            with open(path, "rb") as handle:
                catalog = gettext.GNUTranslations(handle)
            for message, translation in catalog._catalog.items():  # a plural's msgid is a (msgid, index) pair
                source = message[0] if isinstance(message, tuple) else message
                if source:
                    messages.append((source, translation))
    return messages
