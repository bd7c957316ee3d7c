"""Tiny Marian-format model directories for tests: random weights, real sentencepiece models trained on a
synthetic corpus; `make_model_dir` uses our writer, `make_hf_model_dir` transformers' (the independent oracle).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import sentencepiece
import torch

from model.checkpoint import MODEL_CARD_NAME, save_model
from model.config import ModelConfig
from model.transformer import Transformer

# The engine tests' device: cpu here and in CI; bench/gpu/check.py runs them with TRANSLATE_TEST_DEVICE=cuda.
DEVICE = os.environ.get("TRANSLATE_TEST_DEVICE", "cpu")

ENGLISH_WORDS = (
    "the cat dog sat on mat I you we they like love see saw went to school house big small red blue "
    "green quick brown fox jumps over lazy tree river city walk run eat drink water tea coffee book read "
    "write today tomorrow yesterday is was are were very happy sad cold hot morning night friend family"
).split()
CHINESE_CHARACTERS = (
    "我你他她们的是不在有这个人了上下大小猫狗坐喜欢看去学校房子红蓝绿快跑吃喝水茶咖啡书读写今天明昨很高兴冷热早晚朋友家"
)


def synthetic_corpus(count: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    """English-like sentences and a learnable "translation": each word maps to a fixed character."""
    rng = random.Random(seed)
    dictionary = {word: CHINESE_CHARACTERS[i % len(CHINESE_CHARACTERS)] for i, word in enumerate(ENGLISH_WORDS)}
    pairs = []
    for _ in range(count):
        words = [rng.choice(ENGLISH_WORDS) for _ in range(rng.randint(2, 9))]
        mark = rng.randrange(3)
        english = " ".join(words).capitalize() + ".?!"[mark]
        chinese = "".join(dictionary[w] for w in words) + "。？！"[mark]
        pairs.append((english, chinese))
    return pairs


def train_spm(path: Path, sentences: list[str], vocab_size: int) -> None:
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_prefix=str(path.with_suffix("")),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
    )
    path.with_suffix(".model").rename(path)
    path.with_suffix(".vocab").unlink(missing_ok=True)


def _pieces(spm_path: Path) -> list[str]:
    processor = sentencepiece.SentencePieceProcessor()
    processor.Load(str(spm_path))
    return [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]


def write_tokenizer_files(directory: Path, shared_vocab: bool, seed: int = 0) -> tuple[dict[str, int], dict[str, int]]:
    """source.spm/target.spm plus vocabularies; returns (source_vocab, target_vocab).

    Shared vocabularies use the OPUS-MT layout (</s>=0, <unk>=1, pieces, <pad> last);
    separate ones put <pad> at 2, as our trainer does.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pairs = synthetic_corpus(seed=seed)
    train_spm(directory / "source.spm", [p[0] for p in pairs], 120)
    train_spm(directory / "target.spm", [p[1] for p in pairs], 90)
    source_pieces, target_pieces = _pieces(directory / "source.spm"), _pieces(directory / "target.spm")
    if shared_vocab:
        vocab = {"</s>": 0, "<unk>": 1}
        for piece in source_pieces + target_pieces:
            vocab.setdefault(piece, len(vocab))
        vocab["<pad>"] = len(vocab)
        (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        return vocab, vocab
    vocabs = []
    for name, pieces in (("vocab.json", source_pieces), ("target_vocab.json", target_pieces)):
        vocab = {"</s>": 0, "<unk>": 1, "<pad>": 2}
        for piece in pieces:
            vocab.setdefault(piece, len(vocab))
        (directory / name).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        vocabs.append(vocab)
    (directory / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": True}), encoding="utf-8")
    return vocabs[0], vocabs[1]


def tiny_config_values(source_vocab: dict, target_vocab: dict, shared: bool, **overrides) -> dict:
    values = dict(
        vocab_size=len(source_vocab),
        decoder_vocab_size=len(target_vocab),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=128,
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=True,
        pad_token_id=target_vocab["<pad>"],
        eos_token_id=0,
        decoder_start_token_id=target_vocab["<pad>"],
    )
    values.update(overrides)
    return values


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Non-trivial layer norms and output bias, so the comparison exercises every tensor."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                mean = 1.0 if name.endswith("weight") else 0.0
                parameter.copy_(mean + 0.3 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
        bias = model.final_logits_bias
        bias.copy_(0.5 * torch.randn(bias.shape, generator=generator).reshape(bias.shape))


def make_model_dir(
    directory: Path, shared: bool = True, seed: int = 0, model_card: str | None = None, **overrides
) -> Path:
    """A random model written by our own checkpoint writer; model_card: its README.md (an OPUS-MT card names the
    training recipe, which decides the alignment head of a model that declares none)."""
    source_vocab, target_vocab = write_tokenizer_files(directory, shared, seed)
    if model_card is not None:
        (directory / MODEL_CARD_NAME).write_text(model_card, encoding="utf-8")
    config = ModelConfig(**tiny_config_values(source_vocab, target_vocab, shared, **overrides))
    torch.manual_seed(seed)
    model = Transformer(config)
    randomize(model, seed)
    save_model(model, directory)
    return directory


def make_hf_model_dir(
    directory: Path, shared: bool = True, seed: int = 0, init_std: float | None = None, **overrides
) -> Path:
    """A random model written by transformers' MarianMTModel (the oracle's own format). init_std: transformers'
    own initialisation at that standard deviation (every tensor a real checkpoint has, and nothing else, as
    another engine's converter expects); None: `randomize`d, layer norms and output bias included."""
    from transformers import MarianConfig, MarianMTModel

    source_vocab, target_vocab = write_tokenizer_files(directory, shared, seed)
    values = tiny_config_values(source_vocab, target_vocab, shared, **overrides)
    torch.manual_seed(seed)
    if init_std is not None:
        model = MarianMTModel(MarianConfig(**values, dropout=0.0, init_std=init_std))
    else:
        model = MarianMTModel(MarianConfig(**values, dropout=0.0))
        randomize(model, seed)
    model.save_pretrained(directory)
    return directory
