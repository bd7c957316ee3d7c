"""The engine's exception hierarchy; the service maps each class to one HTTP status."""

from __future__ import annotations


class TranslatorError(Exception):
    """Base class for every error the engine raises on purpose."""


class InvalidInputError(TranslatorError, ValueError):
    """The caller's input is malformed (empty batch, bad option, wrong type)."""


class InputTooLongError(InvalidInputError):
    """An input exceeds a configured or architectural length limit."""


class UnknownModelError(TranslatorError, LookupError):
    """A model name or path is not among the configured ones."""


class CheckpointError(TranslatorError):
    """A model directory is missing, corrupt, unsafe (pickle) or does not match its config."""


class DecoderBusyError(TranslatorError):
    """The continuous scheduler's queue is full: more requests wait than it was configured to hold."""
