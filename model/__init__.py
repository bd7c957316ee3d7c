"""Marian-compatible Transformer engine: load, translate, explain. No web code lives here."""

from model.config import ModelConfig
from model.errors import CheckpointError, InputTooLongError, InvalidInputError, TranslatorError, UnknownModelError
from model.search import Hypothesis
from model.transformer import Transformer
from model.translator import Translation, Translator

__all__ = [
    "CheckpointError",
    "Hypothesis",
    "InputTooLongError",
    "InvalidInputError",
    "ModelConfig",
    "Transformer",
    "Translation",
    "Translator",
    "TranslatorError",
    "UnknownModelError",
]
