"""The service core as the compatibility routes see it: one small typed interface, which service/app.py's Ingress
implements and hands to the routers when it mounts them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from starlette.requests import Request

from service.documents.jobs import DocumentJobs
from service.glossaries import Glossaries
from service.messages import TranslateCall
from service.records import TranslationRecord


@dataclass(frozen=True)
class LanguagePair:
    """One served model and the languages it translates between (the codes deploy/serve.yaml gives it)."""

    model: str
    source_lang: str
    target_lang: str


class TranslationBackend(Protocol):
    """What LibreTranslate's and DeepL's routes need from the service core."""

    def language_pairs(self) -> Sequence[LanguagePair]:
        """The served models, one pair each."""
        ...

    async def translate_call(self, model: str, call: TranslateCall) -> list[TranslationRecord]:
        """One translation per text of `call` (as /v1/translate gives it), decoded by `model` within the
        service's in-flight limit and request timeout; refusals raise the service's errors (service/errors.py)."""
        ...

    @property
    def keys_required(self) -> bool:
        """Whether the service asks for API keys."""
        ...

    @property
    def request_timeout_s(self) -> float:
        """How long a model call may take before it answers 504."""
        ...

    @property
    def glossaries(self) -> Glossaries:
        """The glossaries every replica shares."""
        ...

    @property
    def documents(self) -> DocumentJobs:
        """The document jobs every replica shares."""
        ...

    def wake_documents(self) -> None:
        """A document was queued: this replica's worker looks for it now."""
        ...

    def owner(self, request: Request) -> str:
        """Who owns what `request` makes or reads: its API key's digest with keys on, else ""."""
        ...


# How a router finds the backend of a request: the replica's ingress is made after the routes are declared.
BackendProvider = Callable[[Request], TranslationBackend]

__all__ = ["BackendProvider", "LanguagePair", "TranslationBackend"]
