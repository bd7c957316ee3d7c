"""The training mix recipe on the real shared data, and the character-level Chinese vocabulary it trains.

Oracles: the dev and test files read here with plain code (not the recipe's readers), the gold sets' own word
segmentation (jieba's, made for the human links), and transformers' MarianTokenizer.
"""

from __future__ import annotations

import csv
import json
import unicodedata
from pathlib import Path

import pytest
import torch

from model.training.data import main as data_main
from model.training.options import TrainingOptions
from model.training.train import build_model
from model.training.vocabulary import prepare_tokenizer, train_sentencepiece

REPO = Path(__file__).resolve().parents[3]
DATA = REPO.parent / "shared" / "data"

pytestmark = pytest.mark.skipif(
    not (DATA / "hsk-en-zh" / "train.tsv").is_file(), reason=f"shared data missing at {DATA}"
)


def plain(text: str) -> str:
    """An independent normal form: NFKC, case-folded, letters and digits only."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).casefold() if c.isalnum())


def held_out_sentences() -> set[str]:
    texts: set[str] = set()
    with open(DATA / "tatoeba-en-zh" / "dev.tsv", encoding="utf-8") as handle:
        for row in csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
            texts.update(row[:2])
    for name in (
        "tico19-en-zh/test.en",
        "tico19-en-zh/test.zh",
        "flores200-en-zh/devtest.en",
        "flores200-en-zh/devtest.zh",
    ):
        texts.update((DATA / name).read_text(encoding="utf-8").splitlines())
    for record in json.loads((DATA / "alignment-tatoeba-zh-en" / "dev.json").read_text(encoding="utf-8")):
        texts.update((record["en"], record["zh"]))
    return {plain(t) for t in texts if len(plain(t)) > 3}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    output = tmp_path_factory.mktemp("mix")
    assert data_main(["build", "--data", str(DATA), "--output", str(output)]) == 0
    return output


def read(path: Path) -> list[list[str]]:
    return [line.rstrip("\n").split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


def test_no_training_pair_shares_a_side_with_a_dev_or_test_sentence(built):
    held = held_out_sentences()
    for name in ("dev-hsk.tsv", "dev-tatoeba.tsv"):
        held.update(plain(side) for row in read(built / name) for side in row[:2] if len(plain(side)) > 3)
    rows = read(built / "train.tsv")
    leaked = [row[:2] for row in rows if plain(row[0]) in held or plain(row[1]) in held]
    assert not leaked[:5]


def test_every_pair_carries_its_source_and_attribution(built):
    rows = read(built / "train.tsv")
    recipe = json.loads((built / "recipe.json").read_text(encoding="utf-8"))
    by_source = {row["source"]: row for row in recipe["table"]}
    assert set(by_source) == {"tatoeba", "hsk", "cedict"}
    for row in rows:
        assert len(row) == 4 and row[2] and row[3] in by_source
    for name, counts in by_source.items():
        assert sum(row[3] == name for row in rows) == counts["lines"] == counts["kept"] * counts["weight"]
    tatoeba = [row for row in rows if row[3] == "tatoeba"]
    assert all(row[2].startswith("CC-BY 2.0 (France)") for row in tatoeba)
    # Dictionary pairs are short: a headword of at most three characters, a gloss of at most four words.
    cedict = [row for row in rows if row[3] == "cedict"]
    assert cedict and all(len(row[1]) <= 3 and len(row[0].split()) <= 4 for row in cedict)


def test_hsk_development_pairs_are_the_packages_own_and_stable(built, tmp_path):
    hsk = {(row[0], row[1]) for row in read(DATA / "hsk-en-zh" / "train.tsv") if len(row) >= 2}
    dev = [tuple(row[:2]) for row in read(built / "dev-hsk.tsv")]
    assert len(dev) == 300 and set(dev) <= hsk
    again = tmp_path / "again"
    data_main(["build", "--data", str(DATA), "--output", str(again), "--sources", "hsk"])
    assert [tuple(row[:2]) for row in read(again / "dev-hsk.tsv")] == dev


def test_character_pieces_never_cross_a_gold_word(tmp_path):
    """The gold set's own segmentation: every piece of a char-level model lies inside one of its words."""
    chinese = [row[1] for row in read(DATA / "hsk-en-zh" / "train.tsv") if len(row) >= 2]
    chinese += [row[1] for row in read(DATA / "tatoeba-en-zh" / "train.tsv") if len(row) >= 2]
    path = tmp_path / "target.spm"
    train_sentencepiece(chinese, path, 8000, 0.9995, spaced=False, model_type="char")
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    records = json.loads((DATA / "alignment-tatoeba-zh-en" / "dev.json").read_text(encoding="utf-8"))
    crossing = []
    for record in records:
        text = record["zh"]
        char_at = {len(text[:i].encode()): i for i in range(len(text) + 1)}  # byte offset → character offset
        for piece in processor.encode(text, return_type="proto").pieces:
            begin, end = char_at[piece.begin], char_at[piece.end]
            if text[begin:end].strip() and not any(s <= begin and end <= e for s, e in record["zh_spans"]):
                crossing.append((text, text[begin:end]))
    assert not crossing


def test_a_retokenized_warm_start_keeps_every_shared_pieces_row(tmp_path, shared_model_dir):
    """--retokenize: new vocabulary, the old rows carried piece by piece, readable by transformers."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    pairs = [(row[0], row[1]) for row in read(DATA / "hsk-en-zh" / "train.tsv")[:800] if len(row) >= 2]
    config = json.loads((shared_model_dir / "config.json").read_text())
    options = TrainingOptions(
        train="", dev=None, work=str(tmp_path / "work"), output=None, source_vocab_size=300, target_vocab_size=3000,
        target_model_type="char", init_from=str(shared_model_dir), retokenize=True, d_model=config["d_model"],
        heads=config["encoder_attention_heads"], ffn_dim=config["encoder_ffn_dim"],
        encoder_layers=config["encoder_layers"], decoder_layers=config["decoder_layers"],
        activation=config["activation_function"],
    )  # fmt: skip
    tokenizer = prepare_tokenizer(options, pairs, tmp_path / "work")
    model = build_model(options, tokenizer)
    old_vocab = json.loads((shared_model_dir / "vocab.json").read_text(encoding="utf-8"))
    old = load_file(str(shared_model_dir / "model.safetensors"))
    old_table = old.get("model.shared.weight", old.get("model.encoder.embed_tokens.weight")).float()
    shared = [(piece, i) for piece, i in tokenizer.target_vocab.items() if piece in old_vocab and piece != "<pad>"]
    assert shared, "the tiny model and the new vocabulary share no piece"
    table = model.decoder_embed_tokens.weight.detach()
    for piece, new_id in shared:
        assert torch.equal(table[new_id], old_table[old_vocab[piece]].to(table.dtype)), piece
    # The new Chinese side is one piece per character, and transformers' tokenizer reads the same ids.
    sentence = pairs[0][1]
    ids = tokenizer.encode_target(sentence)
    assert len(ids) == len(sentence.replace(" ", "")) + 1
    spm_dir = tmp_path / "work" / "tokenizer"
    (spm_dir / "vocab.json").write_text((spm_dir / "joint_vocab.json").read_text(encoding="utf-8"), encoding="utf-8")
    reference = transformers.MarianTokenizer(
        source_spm=str(spm_dir / "source.spm"),
        target_spm=str(spm_dir / "target.spm"),
        vocab=str(spm_dir / "vocab.json"),
    )
    assert reference(text_target=sentence)["input_ids"] == ids
