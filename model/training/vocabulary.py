"""The tokenizers a training run makes or reuses: one sentencepiece model per side and the Marian vocabulary
(joint, in the OPUS-MT layout CTranslate2's converter expects, or one per side)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import sentencepiece

from model.tokenizer import EOS, PAD, UNK, MarianTokenizer, is_cjk
from model.training.options import TrainingOptions

logger = logging.getLogger("model.training.train")


def train_sentencepiece(
    texts: list[str], path: Path, vocab_size: int, coverage: float, spaced: bool = True, model_type: str = "unigram"
) -> None:
    """A sentencepiece model with <unk> only (Marian's vocab.json supplies </s> and <pad>).

    model_type "unigram" learns word-respecting pieces; "char" keeps one piece per character seen in at
    least `coverage` of the text (vocab_size is then only an upper bound).

    Deterministic for the same texts (one thread; sentencepiece takes no seed), so --seed needs no part here.
    For a language written without spaces (spaced=False: Chinese) no "▁" is put before the text, so a
    sentence does not start with a lone "▁" piece the model must learn to write.
    """
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(path.with_suffix("")),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=coverage,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        hard_vocab_limit=False,
        add_dummy_prefix=spaced,
        minloglevel=2,
        num_threads=1,
    )
    path.with_suffix(".model").rename(path)
    path.with_suffix(".vocab").unlink(missing_ok=True)


def marian_vocab(spm_path: Path) -> dict[str, int]:
    """</s>=0, <unk>=1, <pad>=2, then every sentencepiece piece in order."""
    processor = sentencepiece.SentencePieceProcessor()
    processor.Load(str(spm_path))
    vocab = {EOS: 0, UNK: 1, PAD: 2}
    for index in range(processor.GetPieceSize()):
        piece = processor.IdToPiece(index)
        if piece not in vocab:
            vocab[piece] = len(vocab)
    return vocab


def joint_vocab(spm_dir: Path) -> dict[str, int]:
    """One vocabulary for both sides in the OPUS-MT layout: </s>=0, <unk>=1, pieces, <pad> last.

    This is the layout CTranslate2's Marian converter expects (it drops the last row as <pad>
    and starts the decoder from a zero embedding).
    """
    vocab = {EOS: 0, UNK: 1}
    for side in ("source", "target"):
        for piece in marian_vocab(spm_dir / f"{side}.spm"):
            if piece not in (EOS, UNK, PAD):
                vocab.setdefault(piece, len(vocab))
    vocab[PAD] = len(vocab)
    return vocab


def prepare_tokenizer(options: TrainingOptions, pairs: list[tuple[str, str]], work: Path) -> MarianTokenizer:
    spm_dir = work / "tokenizer"
    spm_dir.mkdir(parents=True, exist_ok=True)
    if options.init_from and not options.retokenize:
        # Continue from an exported model: its tokenizers and vocabulary, unchanged.
        origin = Path(options.init_from)
        for name in ("source.spm", "target.spm"):
            if not (spm_dir / name).exists():
                shutil.copy(origin / name, spm_dir / name)
        if options.joint_vocab and not (spm_dir / "joint_vocab.json").exists():
            shutil.copy(origin / "vocab.json", spm_dir / "joint_vocab.json")
    for side, index, size, coverage, model_type in (
        ("source", 0, options.source_vocab_size, options.source_character_coverage, options.source_model_type),
        ("target", 1, options.target_vocab_size, options.target_character_coverage, options.target_model_type),
    ):
        path = spm_dir / f"{side}.spm"
        if not path.exists():
            logger.info("training %s sentencepiece model (%s, up to %d pieces)", side, model_type, size)
            texts = [pair[index] for pair in pairs]
            spaced = guess_language(texts[:200]) != "zh"
            train_sentencepiece(texts, path, size, coverage, spaced, model_type)
    if options.joint_vocab:
        vocab_path = spm_dir / "joint_vocab.json"
        if not vocab_path.exists():
            vocab_path.write_text(json.dumps(joint_vocab(spm_dir), ensure_ascii=False), encoding="utf-8")
        source_vocab = target_vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    else:
        vocabs = []
        for side in ("source", "target"):
            vocab_path = spm_dir / f"{side}_vocab.json"
            if not vocab_path.exists():
                vocab_path.write_text(
                    json.dumps(marian_vocab(spm_dir / f"{side}.spm"), ensure_ascii=False), encoding="utf-8"
                )
            vocabs.append(json.loads(vocab_path.read_text(encoding="utf-8")))
        source_vocab, target_vocab = vocabs
    load = sentencepiece.SentencePieceProcessor
    source_spm, target_spm = load(), load()
    source_spm.Load(str(spm_dir / "source.spm"))
    target_spm.Load(str(spm_dir / "target.spm"))
    return MarianTokenizer(source_spm, target_spm, source_vocab, target_vocab)


def guess_language(texts: list[str]) -> str:
    """ "zh" when most characters of the given texts are CJK, else "en"."""
    text = "".join(texts)
    return "zh" if sum(map(is_cjk, text)) > len(text) / 2 else "en"
