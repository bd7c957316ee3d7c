"""Software strings as training pairs: the machine's own gettext catalogs (as OPUS's GNOME, KDE and Ubuntu corpora).

Each zh_CN catalog under /usr/share/locale is read with Python's gettext, at build time (never committed): every
msgid → msgstr, plural forms by their first form (Chinese has one), message context dropped from the key. A
mnemonic is stripped where the Chinese side marks one ("取消(_C)" for "_Cancel"), whitespace is folded, and
placeholders (`%s`, `{name}`, `%(count)d`) are kept as written, so that the model learns to carry them. Pairs are
deduplicated and filtered by length and length ratio. The catalogs `HELD_OUT` name are the domain's test: none of
their pairs is trained on, nor any pair either side of which they hold.

    python -m model.training.catalogs --output runs/catalogs   # catalogs.tsv, held-out.tsv, catalogs.json
"""

from __future__ import annotations

import argparse
import gettext
import json
import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

LOCALE_DIR = Path("/usr/share/locale/zh_CN/LC_MESSAGES")
HELD_OUT = ("git", "coreutils", "dpkg", "glib20")  # evaluation only: never trained on nor chosen by
MAX_CHARS = 300  # longer entries are help paragraphs with layout of their own
RATIO = (0.6, 12.0)  # English characters per Chinese character, outside which a pair is not a translation
_MNEMONIC_ZH = re.compile(r"\s*[(（][_&]([A-Za-z0-9])[A-Za-z0-9]*[)）]")  # "(_C)", "(&O)", once "(_PIM)"
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class CatalogPair:
    english: str
    chinese: str
    catalog: str  # the .mo file's name without its suffix (the gettext domain)


def strip_mnemonic(english: str, chinese: str) -> tuple[str, str]:
    """A menu item's access key out of both sides, where the Chinese side marks one as "(_X)" or "(&X)": the
    English side's `_` or `&` before that key goes (GTK's and Qt's markers); otherwise both stay as written
    (an underscore in "GIT_DIR" is text)."""
    found = _MNEMONIC_ZH.search(chinese)
    if found is None:
        return english, chinese
    key = found.group(1)
    marked = re.search(rf"[_&](?=[{re.escape(key.lower())}{re.escape(key.upper())}])", english)
    if marked is not None:
        english = english[: marked.start()] + english[marked.end() :]
    return english, _MNEMONIC_ZH.sub("", chinese)


def fold(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def read_catalog(path: Path) -> list[CatalogPair]:
    """Every translated message of one .mo catalog, cleaned (header, empty and untranslated entries left out)."""
    with path.open("rb") as handle:
        catalog = gettext.GNUTranslations(handle)._catalog
    pairs = []
    for key, translated in catalog.items():
        if isinstance(key, tuple):  # a plural form: (msgid, index); Chinese has one form
            key, index = key
            if index != 0:
                continue
        original = key.split("\x04", 1)[-1]  # "context\x04msgid"
        if not original.strip() or not translated.strip() or translated == original:
            continue
        english, chinese = strip_mnemonic(original, translated)
        pairs.append(CatalogPair(fold(english), fold(chinese), path.stem))
    return pairs


def usable(pair: CatalogPair) -> bool:
    if not pair.english or not pair.chinese or max(len(pair.english), len(pair.chinese)) > MAX_CHARS:
        return False
    return RATIO[0] <= len(pair.english) / len(pair.chinese) <= RATIO[1]


def catalog_pairs(locale_dir: Path = LOCALE_DIR, held_out: tuple[str, ...] = HELD_OUT) -> dict[str, list]:
    """{"train": pairs of every catalog but the held-out ones (deduplicated, filtered, and none either side of
    which a held-out catalog holds), "held_out": the held-out catalogs' pairs (deduplicated, filtered)}."""
    train, test = [], []
    for path in sorted(locale_dir.glob("*.mo")):
        (test if path.stem in held_out else train).extend(read_catalog(path))
    test = _unique([pair for pair in test if usable(pair)])
    seen_sides = {pair.english for pair in test} | {pair.chinese for pair in test}
    train = [pair for pair in train if pair.english not in seen_sides and pair.chinese not in seen_sides]
    return {"train": _unique([pair for pair in train if usable(pair)]), "held_out": test}


def _unique(pairs: list[CatalogPair]) -> list[CatalogPair]:
    seen, out = set(), []
    for pair in pairs:
        if (pair.english, pair.chinese) not in seen:
            seen.add((pair.english, pair.chinese))
            out.append(pair)
    return out


def provenance(path: Path) -> dict:
    """The Debian package that installed a catalog, its version and its copyright file (the licence's record)."""
    try:
        owner = subprocess.run(["dpkg", "-S", str(path)], capture_output=True, text=True, check=True).stdout
        package = owner.split(":", 1)[0].strip()
        version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True,
                                 text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {"package": None, "version": None, "copyright": None}
    copyright_file = Path("/usr/share/doc") / package / "copyright"
    return {"package": package, "version": version,
            "copyright": str(copyright_file) if copyright_file.is_file() else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locale-dir", type=Path, default=LOCALE_DIR)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    parts = catalog_pairs(args.locale_dir)
    args.output.mkdir(parents=True, exist_ok=True)
    for name, file in (("train", "catalogs.tsv"), ("held_out", "held-out.tsv")):
        with (args.output / file).open("w", encoding="utf-8") as out:
            for pair in parts[name]:
                out.write(f"{pair.english}\t{pair.chinese}\t{pair.catalog}\n")
    counts = {name: Counter(pair.catalog for pair in pairs) for name, pairs in parts.items()}
    manifest = {
        "locale_dir": str(args.locale_dir),
        "held_out_catalogs": list(HELD_OUT),
        "pairs": {name: len(pairs) for name, pairs in parts.items()},
        "catalogs": {
            path.stem: {**provenance(path), "train": counts["train"].get(path.stem, 0),
                        "held_out": counts["held_out"].get(path.stem, 0)}
            for path in sorted(args.locale_dir.glob("*.mo"))
        },
    }
    (args.output / "catalogs.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1), encoding="utf-8")
    print(json.dumps(manifest["pairs"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
