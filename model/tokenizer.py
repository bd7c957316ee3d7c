"""Sentencepiece tokenization with Marian vocabularies, id-for-id with transformers' MarianTokenizer.

Source text → source.spm pieces → vocab.json ids (unknown pieces → <unk>) + </s>.
Target ids → vocabulary pieces → target.spm detokenization. When the vocabularies
are separate, the target side reads target_vocab.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import sentencepiece

from model.errors import CheckpointError

WORD_BOUNDARY = "\u2581"  # sentencepiece's "▁", a space before the piece
EOS, UNK, PAD = "</s>", "<unk>", "<pad>"


def _load_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path.name} is missing in {path.parent}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise CheckpointError(f"{path} must map pieces to integer ids")
    if UNK not in vocab or EOS not in vocab:
        raise CheckpointError(f"{path} must contain {UNK} and {EOS}")
    return vocab


def _load_spm(path: Path) -> sentencepiece.SentencePieceProcessor:
    if not path.is_file():
        raise CheckpointError(f"{path.name} is missing in {path.parent}")
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (OSError, RuntimeError) as error:
        raise CheckpointError(f"{path} is not a sentencepiece model: {error}") from None
    return processor


def is_cjk(character: str) -> bool:
    code = ord(character)
    return (
        0x3400 <= code <= 0x9FFF
        or 0xF900 <= code <= 0xFAFF
        or 0x3000 <= code <= 0x303F
        or 0xFF00 <= code <= 0xFFEF
        or 0x20000 <= code <= 0x2FA1F
    )


# The full-width punctuation Chinese writes, which NFKC normalization (sentencepiece's default) folds to ASCII.
_FULL_WIDTH = {",": "，", "?": "？", "!": "！", ":": "：", ";": "；", "(": "（", ")": "）"}


def _is_ideograph(character: str) -> bool:
    code = ord(character)
    return 0x3400 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF or 0x20000 <= code <= 0x2FA1F or character in "。、"


def restore_full_width(text: str) -> str:
    """Give back Chinese punctuation its full width where it follows (or an opening bracket precedes)
    Chinese text: "你好吗?" → "你好吗？", while "1,000", "OK!" and English stay as they are."""
    if not any(_is_ideograph(c) for c in text):
        return text
    characters = list(text)
    for index, character in enumerate(characters):
        if character not in _FULL_WIDTH:
            continue
        before = text[:index].rstrip()
        after = text[index + 1 :].lstrip()
        if character == "(":
            chinese = bool(after) and _is_ideograph(after[0])
        else:
            chinese = bool(before) and (_is_ideograph(before[-1]) or before[-1] in "）」』")
        if chinese:
            characters[index] = _FULL_WIDTH[character]
    result = "".join(characters)
    # no spaces around full-width punctuation
    for mark in _FULL_WIDTH.values():
        result = result.replace(" " + mark, mark).replace(mark + " ", mark)
    return result


def is_special_piece(piece: str) -> bool:
    """</s>, <unk>, <pad> and the like: tokens that stand for no text."""
    return piece.startswith("<") and piece.endswith(">") and len(piece) > 2


def is_lone_space(piece: str) -> bool:
    """A piece that is the word boundary alone ("▁", sentencepiece's dummy prefix before a piece that lacks one)."""
    return piece == WORD_BOUNDARY


def word_groups(pieces: list[str]) -> list[list[int]]:
    """Group piece indices into words: a new word at each "▁" and around CJK characters.

    Chinese has no spaces, so each piece made of CJK characters is its own word; a
    special token (</s>) is its own word too. A lone "▁" is the space before the word that follows it.
    """
    groups: list[list[int]] = []
    spaces: list[int] = []  # lone "▁" pieces waiting for their word
    previous_cjk = False
    for index, piece in enumerate(pieces):
        special = is_special_piece(piece)
        if is_lone_space(piece):
            spaces.append(index)
            continue
        if spaces and special:  # nothing follows but </s>: the space ends the word before it
            if groups:
                groups[-1].extend(spaces)
            else:
                groups.append(spaces)
            spaces = []
        text = piece.lstrip(WORD_BOUNDARY)
        cjk = bool(text) and all(is_cjk(c) for c in text)
        starts_word = not groups or spaces or special or piece.startswith(WORD_BOUNDARY) or cjk or previous_cjk
        if starts_word:
            groups.append([*spaces, index])
        else:
            groups[-1].append(index)
        spaces = []
        previous_cjk = cjk or special
    if spaces:
        groups.append(spaces)
    return groups


@dataclass
class MarianTokenizer:
    """Source and target sentencepiece models plus their Marian vocabularies."""

    source_spm: sentencepiece.SentencePieceProcessor
    target_spm: sentencepiece.SentencePieceProcessor
    source_vocab: dict[str, int]
    target_vocab: dict[str, int]

    def __post_init__(self) -> None:
        self.target_pieces = {i: piece for piece, i in self.target_vocab.items()}
        self.source_pieces = {i: piece for piece, i in self.source_vocab.items()}
        self.eos_id = self.source_vocab[EOS]
        self.source_unk_id = self.source_vocab[UNK]
        self.target_unk_id = self.target_vocab[UNK]
        self.special_ids = {self.target_vocab[t] for t in (EOS, UNK, PAD) if t in self.target_vocab}

    @classmethod
    def from_directory(cls, directory: str | Path) -> MarianTokenizer:
        directory = Path(directory)
        source_vocab = _load_vocab(directory / "vocab.json")
        separate = (directory / "target_vocab.json").is_file()
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            try:
                separate = bool(json.loads(config_path.read_text(encoding="utf-8")).get("separate_vocabs", separate))
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{config_path} is not valid JSON: {error}") from None
        target_vocab = _load_vocab(directory / "target_vocab.json") if separate else source_vocab
        return cls(_load_spm(directory / "source.spm"), _load_spm(directory / "target.spm"), source_vocab, target_vocab)

    # ---- source side ------------------------------------------------------------------
    def source_pieces_of(self, text: str) -> list[str]:
        """Sentencepiece pieces of a source text; a leading >>lang<< code stays one piece."""
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return code + self.source_spm.encode(text, out_type=str)

    def encode_source(self, text: str) -> list[int]:
        """Vocabulary ids of a source text followed by </s>, as MarianTokenizer gives them."""
        ids = [self.source_vocab.get(piece, self.source_unk_id) for piece in self.source_pieces_of(text)]
        return ids + [self.eos_id]

    def source_tokens(self, ids: list[int]) -> list[str]:
        return [self.source_pieces.get(i, UNK) for i in ids]

    def source_text(self, ids: list[int]) -> str:
        """Source ids → text (special tokens dropped), for showing what an explanation was made of."""
        pieces = [piece for piece in self.source_tokens(ids) if piece not in (EOS, PAD)]
        return "".join(pieces).replace(WORD_BOUNDARY, " ").strip()

    # ---- target side ------------------------------------------------------------------
    def encode_target(self, text: str) -> list[int]:
        """Target-side ids of a given translation followed by </s> (for forced decoding)."""
        pieces = self.target_spm.encode(text, out_type=str)
        return [self.target_vocab.get(piece, self.target_unk_id) for piece in pieces] + [self.target_vocab[EOS]]

    def target_tokens(self, ids: list[int]) -> list[str]:
        return [self.target_pieces.get(i, UNK) for i in ids]

    def decode(self, ids: list[int]) -> str:
        """Target ids → text, special tokens dropped (MarianTokenizer's decode with skip_special_tokens)."""
        pieces = [self.target_pieces.get(i, UNK) for i in ids if i not in self.special_ids]
        return self.target_spm.decode_pieces(pieces).replace(WORD_BOUNDARY, " ").strip()

    def detokenize(self, ids: list[int]) -> str:
        """The text users see: `decode`, with Chinese punctuation restored to full width."""
        return restore_full_width(self.decode(ids))

    def save_vocabularies(self, directory: str | Path) -> None:
        """Write vocab.json (and target_vocab.json when separate) plus tokenizer_config.json."""
        directory = Path(directory)
        separate = self.source_vocab is not self.target_vocab and self.source_vocab != self.target_vocab
        (directory / "vocab.json").write_text(
            json.dumps(self.source_vocab, ensure_ascii=False, indent=1), encoding="utf-8"
        )
        if separate:
            (directory / "target_vocab.json").write_text(
                json.dumps(self.target_vocab, ensure_ascii=False, indent=1), encoding="utf-8"
            )
        tokenizer_config = {
            "tokenizer_class": "MarianTokenizer",
            "separate_vocabs": separate,
            "eos_token": EOS,
            "unk_token": UNK,
            "pad_token": PAD,
            "model_max_length": 512,
        }
        (directory / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8"
        )


def piece_owners(groups: list[list[int]], count: int, default: int | None = None) -> list[int | None]:
    """For each of `count` pieces the index of the group (word_groups' word) that holds it, `default` for none."""
    owner: list[int | None] = [default] * count
    for word, pieces in enumerate(groups):
        for piece in pieces:
            owner[piece] = word
    return owner
